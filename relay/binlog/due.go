package binlog

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
	"github.com/idem-go/idem/relay/logrelay"
)

// The outbox's SQL the engine calls (logengine.Table): deleting and
// archiving published rows, reading delayed rows, quarantining.

// DueRows reads a page of the delayed rows due at now.
func (r *source) DueRows(ctx context.Context, now time.Time) ([]driver.OutboxRecord, error) {
	rows, err := r.db.QueryContext(ctx, r.sql.due, now)
	if err != nil {
		return nil, err
	}
	return scanRecords(rows)
}

// scanRecords reads the rows of a statement selecting rowColumns.
func scanRecords(rows *sql.Rows) ([]driver.OutboxRecord, error) {
	defer rows.Close()
	var recs []driver.OutboxRecord
	for rows.Next() {
		var rec driver.OutboxRecord
		if err := outboxcodec.ScanRow(rows, &rec, nil); err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, rows.Err()
}

// RowsDone deletes (or with KeepRows marks published) the rows recs read
// from the table once published, and archives their events when archive
// is set: the delete and the archive in one transaction. With KeepRows the
// events are archived first: a crash before the mark publishes the rows
// again, and the archive keeps each event once.
func (r *source) RowsDone(ctx context.Context, recs []*driver.OutboxRecord, archive bool) (affected, archived int64, err error) {
	ids := make([]string, len(recs))
	for i, rec := range recs {
		ids[i] = rec.RawID
	}
	if !archive {
		recs = nil
	}
	if r.cfg.Delete == logrelay.DeletePublished {
		return r.deleteAll(ctx, ids, recs)
	}
	if len(recs) > 0 {
		if _, archived, err = r.deleteAll(ctx, nil, recs); err != nil {
			return 0, 0, err
		}
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	res, err := r.db.ExecContext(qctx, fmt.Sprintf(r.sql.markRows, placeholders(len(ids))), anys(ids)...)
	if err != nil {
		return 0, archived, err
	}
	affected, err = res.RowsAffected()
	return affected, archived, err
}

// deleteAll deletes the rows of ids and archives recs, a thousand at a
// time.
func (r *source) deleteAll(ctx context.Context, ids []string, recs []*driver.OutboxRecord) (deleted, archived int64, err error) {
	for len(ids) > 0 || len(recs) > 0 {
		n, m := min(len(ids), 1000), min(len(recs), 1000)
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		d, a, err := r.Delete(qctx, ids[:n], recs[:m])
		cancel()
		if err != nil {
			return deleted, archived, err
		}
		deleted, archived = deleted+d, archived+a
		ids, recs = ids[n:], recs[m:]
	}
	return deleted, archived, nil
}

func anys(ids []string) []any {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return args
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

// Delete deletes the rows of ids and archives recs in one transaction:
// deleted and archived together, or neither.
func (r *source) Delete(ctx context.Context, ids []string, recs []*driver.OutboxRecord) (deleted, archived int64, err error) {
	del := func(ex interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}) (int64, error) {
		if len(ids) == 0 {
			return 0, nil
		}
		res, err := ex.ExecContext(ctx, `DELETE FROM `+r.sql.table+` WHERE id IN (`+placeholders(len(ids))+`)`, anys(ids)...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	if len(recs) == 0 {
		deleted, err = del(r.db)
		return deleted, 0, err
	}
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = tx.Rollback() }()
	archived, err = r.archive(ctx, tx, recs)
	if err != nil {
		return 0, 0, err
	}
	if deleted, err = del(tx); err != nil {
		return 0, 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, err
	}
	return deleted, archived, nil
}

// Gone reports whether a statement's error says that the connection to
// the server is lost.
func (r *source) Gone(err error) bool {
	var me *gomysql.MySQLError
	return errors.Is(err, gomysql.ErrInvalidConn) || errors.Is(err, sqldriver.ErrBadConn) ||
		(errors.As(err, &me) && (me.Number == 1053 || me.Number == 2006 || me.Number == 2013)) // shutdown, gone away, lost
}
