// Package failrow turns a idem.FailedMessage into the values the dialects
// store in failed_message, and a idem.FailedFilter into the values they
// compare with, with every text encoded by textenc. dialectkit.QueryFailed
// reads the rows back.
package failrow

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/textenc"
)

// Row is a FailedMessage as stored.
type Row struct {
	// Consumer, Source, EventName, AggregateType, AggregateID and Error are
	// encoded (textenc.Encode).
	Consumer, Source, EventName, AggregateType, AggregateID, Error string
	// Headers is the JSON object of the headers, keys and values encoded.
	Headers string
	// Entry is the JSON object of the history record of this save (at now,
	// with the attempts and the encoded error), for dialects that build the
	// history in the client.
	Entry string
	// EventID is nil for uuid.Nil, else the id's text.
	EventID any
	// HeldBy is nil for 0, else the id.
	HeldBy any
	// Key is the message key (nil stays NULL).
	Key []byte
	// Body is the body, never nil (the column is NOT NULL).
	Body []byte
	// Attempts is m.Attempts.
	Attempts int
}

// Encode returns m as stored, its history record dated now.
func Encode(m idem.FailedMessage, now time.Time) (Row, error) {
	r := Row{
		Consumer:      textenc.Encode(m.Consumer),
		Source:        textenc.Encode(m.Source),
		EventName:     textenc.Encode(m.EventName),
		AggregateType: textenc.Encode(m.AggregateType),
		AggregateID:   textenc.Encode(m.AggregateID),
		Error:         textenc.Encode(m.Error),
		Key:           m.Key,
		Body:          m.Body,
		Attempts:      m.Attempts,
	}
	var err error
	if r.Headers, err = textenc.EncodeMap(m.Headers); err != nil {
		return Row{}, err
	}
	entry, err := json.Marshal(idem.FailureRecord{At: now.UTC(), Attempt: m.Attempts, Error: r.Error})
	if err != nil {
		return Row{}, err
	}
	r.Entry = string(entry)
	if m.EventID != uuid.Nil {
		r.EventID = m.EventID.String()
	}
	if m.HeldBy != 0 {
		r.HeldBy = m.HeldBy
	}
	if r.Body == nil {
		r.Body = []byte{}
	}
	return r, nil
}

// Action returns the JSON array of one audit record, a as stored (By and
// Detail encoded), dated a.At or, when it is zero, now.
func Action(a idem.FailedAction, now time.Time) (string, error) {
	if a.At.IsZero() {
		a.At = now
	}
	a.At = a.At.UTC()
	a.By, a.Detail = textenc.Encode(a.By), textenc.Encode(a.Detail)
	b, err := json.Marshal([]idem.FailedAction{a})
	return string(b), err
}

// Change returns the values a dialect's ChangeFailed statement binds for c:
// the body and headers of an edit (an empty body and object otherwise,
// which the statement does not use), and the action's JSON array.
func Change(c driver.FailedChange, now time.Time) (body []byte, headers, action string, err error) {
	body, headers = []byte{}, "{}"
	if c.Edit {
		if c.Body != nil {
			body = c.Body
		}
		if headers, err = textenc.EncodeMap(c.Headers); err != nil {
			return nil, "", "", err
		}
	}
	action, err = Action(c.Action, now)
	return body, headers, action, err
}

// Filter returns f with its text fields encoded, so that they compare
// equal with the stored values.
func Filter(f idem.FailedFilter) idem.FailedFilter {
	f.Consumer = textenc.Encode(f.Consumer)
	f.EventName = textenc.Encode(f.EventName)
	f.AggregateType = textenc.Encode(f.AggregateType)
	f.AggregateID = textenc.Encode(f.AggregateID)
	return f
}

// Aggregates returns the encoded type and id of each of aggs with an id
// (once each), and a map from an encoded pair back to its AggregateRef.
func Aggregates(aggs []idem.AggregateRef) (types, ids []string, back map[idem.AggregateRef]idem.AggregateRef) {
	types = make([]string, 0, len(aggs))
	ids = make([]string, 0, len(aggs))
	back = make(map[idem.AggregateRef]idem.AggregateRef, len(aggs))
	for _, a := range aggs {
		if a.ID == "" {
			continue
		}
		enc := idem.AggregateRef{Type: textenc.Encode(a.Type), ID: textenc.Encode(a.ID)}
		if _, dup := back[enc]; dup {
			continue
		}
		back[enc] = a
		types = append(types, enc.Type)
		ids = append(ids, enc.ID)
	}
	return types, ids, back
}

// Text is textenc.Encode, for the other text columns (consumer names,
// delivery_attempt's last_error).
func Text(s string) string { return textenc.Encode(s) }

// ScanParked returns a scan function for driver.QueryRows over rows of
// (encoded aggregate type, encoded aggregate id, failed_message id), which
// records each id in out under the AggregateRef back maps its pair to.
func ScanParked(out map[idem.AggregateRef]int64, back map[idem.AggregateRef]idem.AggregateRef) func(driver.Rows) error {
	return func(rows driver.Rows) error {
		var (
			enc idem.AggregateRef
			id  int64
		)
		if err := rows.Scan(&enc.Type, &enc.ID, &id); err != nil {
			return err
		}
		if a, ok := back[enc]; ok {
			out[a] = id
		}
		return nil
	}
}

// ParkedAggregates is driver.Dialect.ParkedAggregates for the dialects
// whose statement takes the encoded consumer, then a type and an id per
// aggregate: query(n) is the statement for n aggregates, run once per chunk
// of at most chunk aggregates.
func ParkedAggregates(ctx context.Context, ex driver.Executor, consumer string, aggs []idem.AggregateRef, chunk int, query func(n int) string) (map[idem.AggregateRef]int64, error) {
	out := map[idem.AggregateRef]int64{}
	types, ids, back := Aggregates(aggs)
	for start := 0; start < len(types); start += chunk {
		end := min(len(types), start+chunk)
		args := make([]any, 0, 1+2*(end-start))
		args = append(args, Text(consumer))
		for i := start; i < end; i++ {
			args = append(args, types[i], ids[i])
		}
		if err := driver.QueryRows(ctx, ex, query(end-start), args, ScanParked(out, back)); err != nil {
			return nil, err
		}
	}
	return out, nil
}
