package binlog

import (
	"context"
	"database/sql"
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
func (r *source) Quarantine(ctx context.Context, rec *driver.OutboxRecord, reason error, notify logengine.Notify) (bool, error) {
	if !r.idemTable {
		return false, nil
	}
	done := false
	err := r.inTx(ctx, notify, func(q querier) (int64, error) {
		res, err := q.ExecContext(ctx, r.sql.quarantine, reason.Error(), rec.Attempts, rec.RawID)
		if err != nil {
			if permanent(err) {
				return 0, nil
			}
			return 0, err
		}
		n, _ := res.RowsAffected()
		done = n > 0
		if !done {
			return 0, nil
		}
		return rec.Seq, nil
	})
	return done, err
}

// Park quarantines a message the broker refused Config.QuarantineAfter
// times: its row gets quarantined_at and last_error, or, when its writer
// deleted it, a quarantined copy is inserted. A table without idem's
// columns cannot hold it (false).
func (r *source) Park(ctx context.Context, p logengine.Refused, notify logengine.Notify) (bool, error) {
	if !r.idemTable {
		return false, nil
	}
	err := r.inTx(ctx, notify, func(q querier) (int64, error) { return r.park(ctx, q, p) })
	if err != nil {
		return false, fmt.Errorf("idem: binlog: quarantine a refused message: %w", err)
	}
	return true, nil
}

// park quarantines p on q and returns the seq of its row.
func (r *source) park(ctx context.Context, q querier, p logengine.Refused) (int64, error) {
	rec := p.Rec
	lastError := logengine.RefusedError(p)
	res, err := q.ExecContext(ctx, r.sql.quarantine, lastError, p.Refusals, rec.RawID)
	if err != nil {
		return 0, err
	}
	if n, _ := res.RowsAffected(); n > 0 {
		return rec.Seq, nil
	}
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
	if res, err = q.ExecContext(ctx, query, args...); err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// querier is what the quarantine's statements run on: the pool, or the
// transaction of a notice.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// inTx runs fn on the pool, or, with notify, in a transaction that calls
// notify with the seq fn returns (0: nothing quarantined, no notice).
func (r *source) inTx(ctx context.Context, notify logengine.Notify, fn func(querier) (int64, error)) error {
	if notify == nil {
		_, err := fn(r.db)
		return err
	}
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	seq, err := fn(tx)
	if err != nil {
		return err
	}
	if seq > 0 {
		if err := notify(ctx, r.drv.Tx(tx), seq); err != nil {
			return err
		}
	}
	return tx.Commit()
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
