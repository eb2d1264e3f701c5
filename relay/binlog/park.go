package binlog

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// quarantine sets aside a row that cannot become a message: in place
// (quarantined_at, last_error), as the polling relay does. The update waits
// for the row's transaction to commit (its row lock). A row its writer
// deleted, or a table without idem's columns, is logged at error level
// with its content instead. It fails only when the database does.
func (r *Relay) quarantine(ctx context.Context, rec driver.OutboxRecord, reason error) error {
	if !r.idemTable {
		r.log.Error("an outbox row cannot be published, and the table has no quarantined_at and last_error columns to set it aside; skipped",
			"id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID,
			"type", rec.Type, "payload", quote(rec.Payload), "headers", quote(rec.RawHeaders), "error", reason)
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	res, err := r.db.ExecContext(qctx, r.sql.quarantine, reason.Error(), rec.Attempts, rec.RawID)
	if err != nil {
		if permanent(err) {
			r.log.Error("an outbox row cannot be published, nor quarantined; skipped",
				"id", rec.RawID, "payload", quote(rec.Payload), "error", reason, "quarantine_error", err)
			return nil
		}
		return fmt.Errorf("idem: binlog: quarantine a row that cannot be published: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		r.log.Error("an outbox row cannot be published, nor quarantined (deleted since); skipped",
			"id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID,
			"type", rec.Type, "payload", quote(rec.Payload), "headers", quote(rec.RawHeaders), "error", reason)
		return nil
	}
	r.stats.quarantined.Add(1)
	r.log.Error("quarantined an outbox row that cannot be published (idem failed list --relay)",
		"id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "error", reason)
	return nil
}

// park quarantines a message the broker refused Config.QuarantineAfter
// times: its row gets quarantined_at and last_error, or, when its writer
// deleted it, a quarantined copy is inserted, where "idem failed
// list|show|retry|remove --relay" find it. A table without idem's columns
// cannot hold it: the message is logged at error level with its content,
// and skipped.
func (r *Relay) park(ctx context.Context, rec *driver.OutboxRecord, refusals int, reason error) error {
	lastError := fmt.Sprintf("refused by the broker on %d attempts; last: %v", refusals, reason)
	if !r.idemTable {
		r.stats.unreadable.Add(1)
		r.log.Error("the broker refused a message on every attempt, and the outbox has no quarantined_at, last_error and attempts columns to park it in; skipped",
			"id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "type", rec.Type,
			"payload", quote(rec.Payload), "headers", quote(rec.RawHeaders), "attempts", refusals, "error", reason)
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	res, err := r.db.ExecContext(qctx, r.sql.quarantine, lastError, refusals, rec.RawID)
	if err == nil {
		if n, _ := res.RowsAffected(); n == 0 {
			var payload, headers any
			if rec.Payload != nil && idem.IsJSONContentType(rec.ContentType) {
				payload = string(rec.Payload)
			}
			if len(rec.RawHeaders) > 0 {
				headers = string(rec.RawHeaders)
			}
			query, args := r.sql.park, []any{rec.RawID, rec.AggregateType, rec.AggregateID, rec.Type,
				payload, rec.OccurredAt.UTC(), rec.AggregateVersion, headers, lastError, refusals}
			if rec.ContentType != "" {
				var bin any
				if !idem.IsJSONContentType(rec.ContentType) {
					bin = append([]byte{}, rec.Payload...)
				}
				query, args = r.sql.parkTyped, append(args, rec.ContentType, bin)
			}
			_, err = r.db.ExecContext(qctx, query, args...)
		}
	}
	if err != nil {
		return fmt.Errorf("idem: binlog: quarantine a refused message: %w", err)
	}
	r.stats.quarantined.Add(1)
	r.log.Error("quarantined a message the broker refused on every attempt; the later messages of its aggregate go on (idem failed list --relay shows it, idem failed retry --relay publishes it again)",
		"id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "type", rec.Type,
		"attempts", refusals, "error", reason)
	return nil
}

// permanent reports whether a statement failed for good (a missing column,
// a value that does not fit): retrying would not help.
func permanent(err error) bool {
	var me *gomysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1054, 1146, 1406, 1264, 1292, 1366: // unknown column/table, data too long, out of range, bad value
		return true
	}
	return false
}

func quote(b []byte) string {
	if len(b) > 1000 {
		return strconv.Quote(string(b[:1000])) + "..."
	}
	return strconv.Quote(string(b))
}
