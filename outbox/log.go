package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// LogPrefixDefault is the start of the default prefix of the WAL messages
// written by a Writer of NewLogWriter and read by the CDC relay (package
// relay/cdc): see LogPrefix.
const LogPrefixDefault = "idem.outbox"

// LogPrefix returns the default prefix of the WAL messages of an outbox:
// "idem.outbox:<schema>.<table>", schema "public" when t.Schema is empty.
// WAL messages reach every replication slot of the database, so each outbox
// needs a prefix of its own: with one shared prefix, the relay of every
// outbox would publish the events of all of them.
func LogPrefix(t idem.Tables) string {
	t = t.WithDefaults()
	return LogPrefixDefault + ":" + cmp.Or(t.Schema, "public") + "." + t.Outbox
}

// ErrNotSupported is returned (wrapped) by NewLogWriter for a driver whose
// dialect cannot write events into the database's log.
var ErrNotSupported = errors.New("idem: outbox: not supported by this database")

// NewLogWriter returns a Writer that writes each event into the database's
// write-ahead log instead of the outbox table: Add and AddExec call
// pg_logical_emit_message(true, prefix, <event>) in the caller's
// transaction. The message exists if and only if the transaction commits,
// at its place in commit order; it costs one WAL record and no row, index or
// vacuum. Only a CDC relay (package relay/cdc, "idem cdc") reading the same
// prefix publishes these events: the polling relay never sees them.
//
// prefix "" means LogPrefix of drv's tables. NewLogWriter returns an error wrapping
// ErrNotSupported when drv's dialect does not implement
// driver.LogMessageEmitter (only PostgreSQL does).
func NewLogWriter[TTx any](drv driver.Driver[TTx], prefix string) (*Writer[TTx], error) {
	em, ok := drv.Dialect().(driver.LogMessageEmitter)
	if !ok {
		return nil, fmt.Errorf("%w: the %s dialect cannot write events into its log (PostgreSQL's pg_logical_emit_message); use NewWriter and a relay", ErrNotSupported, drv.Dialect().Name())
	}
	if prefix == "" {
		prefix = LogPrefix(drv.Dialect().Tables())
	}
	w := NewWriter(drv)
	w.emitter = em
	w.prefix = prefix
	return w, nil
}

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
}

// EncodeLogMessage returns the content of the WAL message of an outbox row
// (NewLogWriter): a JSON object with the outbox table's column names: id,
// aggregatetype, aggregateid, type, payload, occurred_at (RFC 3339),
// aggregate_version and headers (an object of strings).
func EncodeLogMessage(row driver.OutboxRow) ([]byte, error) {
	return json.Marshal(logRecord{
		ID:               row.ID.String(),
		AggregateType:    row.AggregateType,
		AggregateID:      row.AggregateID,
		Type:             row.Type,
		Payload:          row.Payload,
		OccurredAt:       row.OccurredAt.UTC().Format(time.RFC3339Nano),
		AggregateVersion: row.AggregateVersion,
		Headers:          row.Headers,
	})
}

// DecodeLogMessage reads the content of a WAL message written by a Writer of
// NewLogWriter into the record a relay publishes, under the rules of table
// rows: content that cannot become a message (not a JSON object, an id that
// is not a UUID, a version that is not an integer, headers that are not an
// object, a time that is not RFC 3339) comes back with Unreadable set. A
// missing occurred_at is left zero.
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
	var err error
	if rec.ID, err = uuid.Parse(rec.RawID); err != nil {
		rec.ID = uuid.Nil
		problems = append(problems, fmt.Errorf("id %q is not a UUID", rec.RawID))
	}
	if v, ok := fields["aggregate_version"]; ok {
		if err := json.Unmarshal(v, &rec.AggregateVersion); err != nil {
			problems = append(problems, fmt.Errorf("aggregate_version %s is not an integer", quoteCut(v)))
		}
	}
	var at string
	str("occurred_at", &at)
	if at != "" {
		if rec.OccurredAt, err = parseOccurredAt(at); err != nil {
			problems = append(problems, fmt.Errorf("occurred_at %q is not a timestamp with a time zone (want RFC 3339, such as 2026-12-02T08:00:00.123456Z)", at))
		}
	}
	if h, ok := fields["headers"]; ok {
		rec.RawHeaders = h
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(h, &obj); err != nil {
			problems = append(problems, fmt.Errorf("headers %s are not a JSON object", quoteCut(h)))
		} else if len(obj) > 0 {
			rec.Headers = make(map[string]string, len(obj))
			for k, v := range obj {
				var s string
				if json.Unmarshal(v, &s) == nil {
					rec.Headers[k] = s
				} else {
					rec.Headers[k] = string(v)
				}
			}
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

// emit writes rows as WAL messages.
func (w *Writer[TTx]) emit(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow) error {
	contents := make([][]byte, len(rows))
	for i, row := range rows {
		b, err := EncodeLogMessage(row)
		if err != nil {
			return fmt.Errorf("idem: outbox: event %d: %w", i, err)
		}
		contents[i] = b
	}
	if err := w.emitter.EmitLogMessages(ctx, ex, w.prefix, contents); err != nil {
		return fmt.Errorf("idem: outbox: write %d event(s) into the log: %w", len(rows), err)
	}
	return nil
}

// occurredAtLayouts are the forms of occurred_at a WAL message may hold: RFC
// 3339 (what EncodeLogMessage writes, and PostgreSQL's JSON of a
// timestamptz), and PostgreSQL's text output of a timestamptz (now()::text,
// "2026-12-02 08:00:00.123456+00"), which a writer in SQL may well send.
var occurredAtLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999Z07",
	"2006-01-02T15:04:05.999999999Z07",
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
