package dialectkit

import (
	"context"
	"encoding/json"

	"github.com/idem-go/idem/driver"
)

// outboxChunk is the most rows one multi-row insert takes (8 parameters a
// row stays far below every dialect's parameter limit).
const outboxChunk = 1000

// InsertOutboxRows inserts rows in multi-row statements of at most 1000 rows.
// query returns the statement for n rows; rowArgs returns one row's
// arguments, given its payload (nil when empty, else the JSON text) and its
// headers as a JSON object. Dialects call it from InsertOutbox.
func InsertOutboxRows(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow, query func(n int) string,
	rowArgs func(r driver.OutboxRow, payload any, headers string) []any) error {
	for len(rows) > 0 {
		n := min(len(rows), outboxChunk)
		chunk := rows[:n]
		rows = rows[n:]
		var args []any
		for _, r := range chunk {
			var payload any
			if len(r.Payload) > 0 {
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
