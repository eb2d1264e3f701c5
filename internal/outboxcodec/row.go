// Package outboxcodec reads and writes the outbox's events in every form a
// relay meets them: a row as a dialect's query returns it (ScanRow), a row
// as the text of its columns, as logical replication sends it (DecodeText),
// and the content of a WAL message written by outbox.NewLogWriter
// (EncodeLogMessage, DecodeLogMessage). Every form follows the same rules,
// so that an event is published, or refused as unreadable, the same way
// whichever relay reads it.
package outboxcodec

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// Scanner is the row ScanRow reads: driver.Rows, or one row of any other
// source.
type Scanner interface {
	Scan(dest ...any) error
}

// EventID returns the event id of an outbox id, under the rule of
// idem.EventID; its error is the problem of an unreadable row: "id ...
// is empty: ...".
func EventID(raw string) (uuid.UUID, error) {
	id, err := idem.EventID(raw)
	if err != nil {
		var ie *idem.EventIDError
		if errors.As(err, &ie) {
			return uuid.Nil, fmt.Errorf("id %s %s", quoteCut([]byte(raw)), ie.Problem)
		}
		return uuid.Nil, fmt.Errorf("id %s: %w", quoteCut([]byte(raw)), err)
	}
	return id, nil
}

// DecodeHeaders decodes the JSON object of an outbox row's headers column.
// String values are taken as they are; other values (written by programs
// other than idem) keep their JSON text. An empty object, null or nothing
// gives nil.
func DecodeHeaders(raw []byte) (map[string]string, error) {
	if len(raw) == 0 || string(raw) == "{}" || string(raw) == "null" {
		return nil, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	if len(fields) == 0 {
		return nil, nil
	}
	h := make(map[string]string, len(fields))
	for k, v := range fields {
		var s string
		if json.Unmarshal(v, &s) == nil {
			h[k] = s
			continue
		}
		h[k] = string(v)
	}
	return h, nil
}

// ScanRow scans one outbox row whose columns are, in order: id (text),
// aggregatetype, aggregateid, type, payload (JSON text or NULL),
// occurred_at, aggregate_version, headers (JSON text), seq, created_at,
// attempts, content_type (text or NULL), payload_binary (bytes or NULL),
// then the columns of extra. The record's Payload is payload_binary when it
// is not NULL, else payload; a row with both is unreadable, as is a
// payload_binary with a JSON content type (or none) and a JSON payload with
// a content type that is not JSON. timeDest adapts the two timestamps
// to the dialect's representation; nil scans them into time.Time directly.
//
// r.ID is the event id of r.RawID (EventID). It fails only when the result
// cannot be read. A row whose content cannot become a message is returned
// with r.Unreadable set: an id that cannot become an event id (empty, over
// 64 bytes...), headers that are not a JSON object, and, where the database does not
// enforce the columns' types (SQLite, through a timeDest that is a
// sql.Scanner), an occurred_at or aggregate_version that is not a timestamp
// or an integer.
func ScanRow(row Scanner, r *driver.OutboxRecord, timeDest func(*time.Time) any, extra ...any) error {
	var (
		payload, headers  []byte
		contentType, bin  []byte
		version           any
		occurred, created timeProblem
	)
	occurredDest, createdDest := any(&r.OccurredAt), any(&r.CreatedAt)
	if timeDest != nil {
		occurredDest, createdDest = occurred.wrap(timeDest(&r.OccurredAt)), created.wrap(timeDest(&r.CreatedAt))
	}
	dest := append([]any{&r.RawID, &r.AggregateType, &r.AggregateID, &r.Type, &payload, occurredDest,
		&version, &headers, &r.Seq, createdDest, &r.Attempts, &contentType, &bin}, extra...)
	if err := row.Scan(dest...); err != nil {
		return err
	}
	if payload != nil {
		r.Payload = payload
	}
	r.ContentType = string(contentType)
	r.RawHeaders = headers
	var problems []error
	if err := payloadProblem(r.ContentType, payload, bin); err != nil {
		problems = append(problems, err)
	}
	if bin != nil {
		r.Payload = bin
	}
	var err error
	if r.ID, err = EventID(r.RawID); err != nil {
		problems = append(problems, err)
	}
	if r.AggregateVersion, err = integer(version); err != nil {
		problems = append(problems, fmt.Errorf("aggregate_version: %w", err))
	}
	if occurred.err != nil {
		problems = append(problems, fmt.Errorf("occurred_at: %w", occurred.err))
	}
	if r.Headers, err = DecodeHeaders(headers); err != nil {
		problems = append(problems, fmt.Errorf("headers %s are not a JSON object", strconv.Quote(string(headers))))
	}
	if len(problems) > 0 {
		r.Unreadable = &driver.UnreadableError{Seq: r.Seq, Problems: problems}
	}
	return nil
}

// timeProblem scans a timestamp through a dialect's sql.Scanner and keeps
// its error instead of failing the whole row.
type timeProblem struct {
	inner interface{ Scan(any) error }
	err   error
}

func (p *timeProblem) wrap(dest any) any {
	s, ok := dest.(interface{ Scan(any) error })
	if !ok {
		return dest
	}
	p.inner = s
	return p
}

// Scan implements sql.Scanner.
func (p *timeProblem) Scan(src any) error {
	if err := p.inner.Scan(src); err != nil {
		p.err = fmt.Errorf("%s is not a timestamp", describe(src))
	}
	return nil
}

// integer returns v, as scanned into an any, as an int64.
func integer(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case int32:
		return int64(x), nil
	case []byte:
		if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return n, nil
		}
	case string:
		if n, err := strconv.ParseInt(x, 10, 64); err == nil {
			return n, nil
		}
	case float64:
		if x == float64(int64(x)) {
			return int64(x), nil
		}
	}
	return 0, fmt.Errorf("%s is not an integer", describe(v))
}

// describe returns a scanned value as it appears in an error: text quoted
// (whatever bytes it holds), other values with their type.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case []byte:
		return strconv.Quote(string(x))
	case string:
		return strconv.Quote(x)
	}
	return fmt.Sprintf("%v (%T)", v, v)
}

// payloadProblem returns what is wrong with a row's payload columns: both
// set, bytes in payload_binary under a JSON content type, JSON in payload
// under a content type that is not JSON.
func payloadProblem(contentType string, payload, bin []byte) error {
	json := idem.IsJSONContentType(contentType)
	switch {
	case payload != nil && bin != nil:
		return errors.New("payload and payload_binary are both set: a row has one or the other")
	case bin != nil && json:
		return fmt.Errorf("payload_binary is set with the JSON content type %s: a JSON payload is in payload", describe(contentType))
	case payload != nil && !json:
		return fmt.Errorf("payload is set with the content type %s, which is not JSON: such a payload is in payload_binary", describe(contentType))
	}
	return nil
}
