package outboxcodec

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// logRecord is a WAL message's content: the outbox row's columns as a JSON
// object, under the column names.
type logRecord struct {
	ID               string            `json:"id"`
	AggregateType    string            `json:"aggregatetype"`
	AggregateID      string            `json:"aggregateid"`
	Type             string            `json:"type"`
	Payload          json.RawMessage   `json:"payload"`
	OccurredAt       string            `json:"occurred_at"`
	AggregateVersion int64             `json:"aggregate_version"`
	Headers          map[string]string `json:"headers,omitempty"`
	ContentType      string            `json:"content_type,omitempty"`
	PayloadBase64    *[]byte           `json:"payload_base64,omitempty"`
}

// EncodeLogMessage returns the content of the WAL message of an outbox row
// (outbox.NewLogWriter): a JSON object with the outbox table's column
// names: id, aggregatetype, aggregateid, type, payload, occurred_at (RFC
// 3339), aggregate_version and headers (an object of strings), and, for an
// event with a content type, content_type. A payload that is not JSON
// (idem.IsJSONContentType) is payload_base64, its bytes in standard base64,
// instead of payload: a WAL message is a JSON document. It fails
// when occurred_at, in UTC, is not in years 0000 to 9999, which RFC 3339
// cannot write.
func EncodeLogMessage(row driver.OutboxRow) ([]byte, error) {
	if !rfc3339Year(row.OccurredAt) {
		return nil, fmt.Errorf("occurred_at %s is outside years 0000 to 9999 in UTC, which RFC 3339 cannot write", row.OccurredAt.UTC())
	}
	rec := logRecord{
		ID:               row.ID.String(),
		AggregateType:    row.AggregateType,
		AggregateID:      row.AggregateID,
		Type:             row.Type,
		Payload:          row.Payload,
		OccurredAt:       row.OccurredAt.UTC().Format(time.RFC3339Nano),
		AggregateVersion: row.AggregateVersion,
		Headers:          row.Headers,
		ContentType:      row.ContentType,
	}
	if !idem.IsJSONContentType(row.ContentType) {
		b := []byte(row.Payload)
		if b == nil {
			b = []byte{}
		}
		rec.Payload, rec.PayloadBase64 = nil, &b
	}
	return json.Marshal(rec)
}

// DecodeLogMessage reads the content of a WAL message written by
// outbox.NewLogWriter (or by another program, in SQL) into the record a
// relay publishes, under the rules of table rows (the event id is EventID's
// of the id): content that cannot become a message (not a JSON object, an
// id that cannot become an event id, a version that is not an integer,
// headers that are not an object, a time that is not RFC 3339, or outside
// years 0000 to 9999 in UTC) comes back with Unreadable set. A missing
// occurred_at is left zero.
func DecodeLogMessage(content []byte) driver.OutboxRecord {
	var rec driver.OutboxRecord
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(content, &fields); err != nil {
		rec.Unreadable = &driver.UnreadableError{Problems: []error{fmt.Errorf("WAL message %s is not a JSON object", quoteCut(content))}}
		return rec
	}
	var problems []error
	str := func(name string, dst *string) {
		v, ok := fields[name]
		if !ok {
			return
		}
		if err := json.Unmarshal(v, dst); err != nil {
			problems = append(problems, fmt.Errorf("%s %s is not a string", name, quoteCut(v)))
		}
	}
	str("id", &rec.RawID)
	str("aggregatetype", &rec.AggregateType)
	str("aggregateid", &rec.AggregateID)
	str("type", &rec.Type)
	if p, ok := fields["payload"]; ok && string(p) != "null" {
		rec.Payload = p
	}
	str("content_type", &rec.ContentType)
	if b64, ok := fields["payload_base64"]; ok && string(b64) != "null" {
		var raw []byte
		switch {
		case json.Unmarshal(b64, &raw) != nil:
			problems = append(problems, fmt.Errorf("payload_base64 %s is not a base64 string", quoteCut(b64)))
		case rec.Payload != nil:
			problems = append(problems, errors.New("payload and payload_base64 are both set: a WAL message has one or the other"))
		case idem.IsJSONContentType(rec.ContentType):
			problems = append(problems, fmt.Errorf("payload_base64 is set with the JSON content type %q: a JSON payload is payload", rec.ContentType))
		default:
			if raw == nil {
				raw = []byte{}
			}
			rec.Payload = raw
		}
	} else if rec.Payload != nil && !idem.IsJSONContentType(rec.ContentType) {
		problems = append(problems, fmt.Errorf("payload is set with the content type %q, which is not JSON: such a payload is payload_base64", rec.ContentType))
	}
	var err error
	if rec.ID, err = EventID(rec.RawID); err != nil {
		problems = append(problems, err)
	}
	if v, ok := fields["aggregate_version"]; ok {
		if err := json.Unmarshal(v, &rec.AggregateVersion); err != nil {
			problems = append(problems, fmt.Errorf("aggregate_version %s is not an integer", quoteCut(v)))
		}
	}
	var at string
	str("occurred_at", &at)
	if at != "" {
		switch rec.OccurredAt, err = parseOccurredAt(at); {
		case err != nil:
			problems = append(problems, fmt.Errorf("occurred_at %q is not a timestamp with a time zone (want RFC 3339, such as 2026-12-02T08:00:00.123456Z)", at))
		case !rfc3339Year(rec.OccurredAt):
			problems = append(problems, fmt.Errorf("occurred_at %q is outside years 0000 to 9999 in UTC", at))
		}
	}
	if h, ok := fields["headers"]; ok {
		rec.RawHeaders = h
		if rec.Headers, err = DecodeHeaders(h); err != nil {
			problems = append(problems, fmt.Errorf("headers %s are not a JSON object", quoteCut(h)))
		}
	}
	if len(problems) > 0 {
		rec.Unreadable = &driver.UnreadableError{Problems: problems}
	}
	return rec
}

func quoteCut(b []byte) string {
	if len(b) > 200 {
		return strconv.Quote(string(b[:200])) + "..."
	}
	return strconv.Quote(string(b))
}

// occurredAtLayouts are the forms of occurred_at a WAL message may hold: RFC
// 3339 (what EncodeLogMessage writes, and PostgreSQL's JSON of a
// timestamptz), and PostgreSQL's text output of a timestamptz (now()::text,
// "2026-12-02 08:00:00.123456+00"), which a writer in SQL may well send.
var occurredAtLayouts = [...]string{
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999Z07",
	"2006-01-02T15:04:05.999999999Z07",
}

// rfc3339Year reports whether t's year in UTC has the four digits of RFC
// 3339 (and of the envelope's occurred_at): a time parsed with a zone can
// fall outside them.
func rfc3339Year(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 0 && y <= 9999
}

func parseOccurredAt(s string) (time.Time, error) {
	var first error
	for _, layout := range occurredAtLayouts {
		t, err := time.Parse(layout, s)
		if err == nil {
			return t, nil
		}
		if first == nil {
			first = err
		}
	}
	return time.Time{}, first
}
