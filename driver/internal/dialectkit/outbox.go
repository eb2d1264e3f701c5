package dialectkit

import (
	"context"
	"encoding/json"
	"time"

	"github.com/idem-go/idem/driver"
)

// outboxChunk is the most rows one multi-row insert takes (9 parameters a
// row stays far below every dialect's parameter limit).
const outboxChunk = 1000

// InsertOutboxRows inserts rows in multi-row statements of at most 1000 rows.
// query returns the statement for n rows, with the not_before column as the
// ninth of each row when delayed (a chunk without a delayed row leaves the
// column out: writers that delay nothing also work on a schema from before
// migration 0012); rowArgs returns one row's eight other arguments, given
// its payload (nil when empty, else the JSON text) and its headers as a JSON
// object; timeArg turns a not_before time into its argument. Dialects call it
// from InsertOutbox.
func InsertOutboxRows(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow, query func(n int, delayed bool) string,
	rowArgs func(r driver.OutboxRow, payload any, headers string) []any, timeArg func(time.Time) any) error {
	for len(rows) > 0 {
		n := min(len(rows), outboxChunk)
		chunk := rows[:n]
		rows = rows[n:]
		delayed := false
		for _, r := range chunk {
			delayed = delayed || !r.NotBefore.IsZero()
		}
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
			if delayed {
				var nb any
				if !r.NotBefore.IsZero() {
					nb = timeArg(r.NotBefore)
				}
				args = append(args, nb)
			}
		}
		if _, err := ex.Exec(ctx, query(n, delayed), args...); err != nil {
			return err
		}
	}
	return nil
}
