package binlog

import (
	"context"
	"errors"
	"fmt"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/relay/internal/logengine"
)

// Quarantine sets aside a row that cannot become a message: in place
// (quarantined_at, last_error), as the polling relay does. The update waits
// for the row's transaction to commit (its row lock). A row its writer
// deleted, or a table without idem's columns, cannot be (false). It fails
// only when the database does.
func (r *source) Quarantine(ctx context.Context, rec *driver.OutboxRecord, reason error) (bool, error) {
	if !r.idemTable {
		return false, nil
	}
	res, err := r.db.ExecContext(ctx, r.sql.quarantine, reason.Error(), rec.Attempts, rec.RawID)
	if err != nil {
		if permanent(err) {
			return false, nil
		}
		return false, err
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// Park quarantines a message the broker refused Config.QuarantineAfter
// times: its row gets quarantined_at and last_error, or, when its writer
// deleted it, a quarantined copy is inserted. A table without idem's
// columns cannot hold it (false).
func (r *source) Park(ctx context.Context, p logengine.Refused) (bool, error) {
	rec := p.Rec
	lastError := logengine.RefusedError(p)
	if !r.idemTable {
		return false, nil
	}
	res, err := r.db.ExecContext(ctx, r.sql.quarantine, lastError, p.Refusals, rec.RawID)
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
				payload, rec.OccurredAt.UTC(), rec.AggregateVersion, headers, lastError, p.Refusals}
			if rec.ContentType != "" {
				var bin any
				if !idem.IsJSONContentType(rec.ContentType) {
					bin = append([]byte{}, rec.Payload...)
				}
				query, args = r.sql.parkTyped, append(args, rec.ContentType, bin)
			}
			_, err = r.db.ExecContext(ctx, query, args...)
		}
	}
	if err != nil {
		return false, fmt.Errorf("idem: binlog: quarantine a refused message: %w", err)
	}
	return true, nil
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
