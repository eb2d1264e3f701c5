package dialectkit

import (
	"context"
	"encoding/json"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// contentArgs returns the arguments of an outbox row's columns content_type
// (NULL when empty) and payload_binary (the payload when it is not JSON,
// else NULL).
func contentArgs(r driver.OutboxRow) (contentType, binary any) {
	if r.ContentType != "" {
		contentType = r.ContentType
	}
	if !idem.IsJSONContentType(r.ContentType) {
		b := []byte(r.Payload)
		if b == nil {
			b = []byte{}
		}
		binary = b
	}
	return contentType, binary
}

// outboxChunk is the most rows one multi-row insert takes (11 parameters a
// row stays far below every dialect's parameter limit).
const outboxChunk = 1000

// InsertOutboxRows inserts rows in multi-row statements of at most 1000 rows.
// query returns the statement for n rows: each row's eight columns id,
// aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version,
// headers, then not_before when delayed, then content_type and
// payload_binary when typed. A chunk without a delayed row leaves not_before
// out, one without a content type the two others: writers that use neither
// also work on a schema from before migrations 0012 and 0014. rowArgs
// returns one row's eight arguments, given its payload (nil when empty or
// not JSON, else the JSON text) and its headers as a JSON object; timeArg
// turns a not_before time into its argument. Dialects call it from
// InsertOutbox.
func InsertOutboxRows(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow, query func(n int, delayed, typed bool) string,
	rowArgs func(r driver.OutboxRow, payload any, headers string) []any, timeArg func(time.Time) any) error {
	for len(rows) > 0 {
		n := min(len(rows), outboxChunk)
		chunk := rows[:n]
		rows = rows[n:]
		delayed, typed := false, false
		for _, r := range chunk {
			delayed = delayed || !r.NotBefore.IsZero()
			typed = typed || r.ContentType != ""
		}
		var args []any
		for _, r := range chunk {
			var payload any
			if len(r.Payload) > 0 && idem.IsJSONContentType(r.ContentType) {
				payload = string(r.Payload)
			}
			headers := "{}"
			if len(r.Headers) > 0 {
				b, err := json.Marshal(r.Headers)
				if err != nil {
					return err
				}
				headers = string(b)
			}
			args = append(args, rowArgs(r, payload, headers)...)
			if delayed {
				var nb any
				if !r.NotBefore.IsZero() {
					nb = timeArg(r.NotBefore)
				}
				args = append(args, nb)
			}
			if typed {
				ct, bin := contentArgs(r)
				args = append(args, ct, bin)
			}
		}
		if _, err := ex.Exec(ctx, query(n, delayed, typed), args...); err != nil {
			return err
		}
	}
	return nil
}
