package dialectkit

import (
	"context"
	"encoding/json"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// ContentArgs returns the arguments of an outbox row's columns content_type
// (NULL when empty) and payload_binary (the payload when it is not JSON,
// else NULL), which follow the others in every dialect's insert.
func ContentArgs(r driver.OutboxRow) (contentType, binary any) {
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

// outboxChunk is the most rows one multi-row insert takes (10 parameters a
// row stays far below every dialect's parameter limit).
const outboxChunk = 1000

// InsertOutboxRows inserts rows in multi-row statements of at most 1000 rows.
// query returns the statement for n rows; rowArgs returns one row's
// arguments, given its payload (nil when empty or not JSON, else the JSON
// text) and its headers as a JSON object; it ends them with ContentArgs.
// Dialects call it from InsertOutbox.
func InsertOutboxRows(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow, query func(n int) string,
	rowArgs func(r driver.OutboxRow, payload any, headers string) []any) error {
	for len(rows) > 0 {
		n := min(len(rows), outboxChunk)
		chunk := rows[:n]
		rows = rows[n:]
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
		}
		if _, err := ex.Exec(ctx, query(n), args...); err != nil {
			return err
		}
	}
	return nil
}
