package cdc

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
	"github.com/idem-go/idem/relay/internal/logengine"
	"github.com/idem-go/idem/relay/logrelay"
)

// sweepPage is the number of rows read, published and deleted at a time
// among those waiting when the slot was created.
const sweepPage = logengine.DuePage

// sweepColumnsSQL counts the columns the initial rows need: seq for their
// order, published_at and quarantined_at to skip the rows a polling relay
// published or set aside.
const sweepColumnsSQL = `SELECT count(*) FROM pg_attribute
	WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped
	AND attname IN ('seq', 'published_at', 'quarantined_at')`

// initialRows are the rows waiting in the outbox when the slot was created:
// a slot streams only what commits after its creation, so those visible in
// the snapshot of its consistent point (exactly those the stream will not
// send) are published before the stream. They are the rows waiting now
// with a seq at most the highest waiting in that snapshot, read outside
// any transaction; the few of them committed after the snapshot (their
// transaction was open then, with a seq below the highest) are streamed
// too, and published twice, as any row may be.
type initialRows struct {
	s     *source
	sel   string
	count string // counts them, for the progress lines
	after int64  // the last seq read
}

// newInitialRows returns the rows of the outbox's table meeting where with
// a seq at most last.
func newInitialRows(r *source, where string, last int64) *initialRows {
	where = ` seq <= ` + strconv.FormatInt(last, 10) + ` AND` + where
	return &initialRows{s: r,
		sel:   `SELECT * FROM ` + r.sql.table + ` WHERE seq > $1 AND` + where + ` ORDER BY seq LIMIT ` + fmt.Sprint(sweepPage),
		count: `SELECT count(*) FROM ` + r.sql.table + ` WHERE` + where,
	}
}

// initialRowsWhere returns the condition of the rows waiting in the
// outbox, or "" when there are none to look for: with Config.Delete =
// KeepRows (the table holds what the writer keeps, not what waits), and on
// a table without idem's seq, published_at and quarantined_at columns
// (Debezium's five columns only: drain it before the first start; a
// warning says so when it holds rows).
func (r *source) initialRowsWhere(ctx context.Context) (string, error) {
	if r.cfg.Delete != logrelay.DeletePublished {
		return "", nil
	}
	var cols int
	if err := r.pool.QueryRow(ctx, sweepColumnsSQL, r.sql.table).Scan(&cols); err != nil {
		return "", fmt.Errorf("idem: cdc: read the outbox's columns: %w", err)
	}
	if cols != 3 {
		var held bool
		if err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+r.sql.table+`)`).Scan(&held); err == nil && held {
			r.log.Warn("the outbox held rows when the slot was created; they are not in its stream, and without idem's seq, published_at and quarantined_at columns the relay cannot tell which wait: publish them another way (the polling relay, idem relay), or delete them",
				"table", r.sql.table)
		}
		return "", nil
	}
	// Delayed rows wait in the table for their time (Table.DueRows).
	where := ` published_at IS NULL AND quarantined_at IS NULL`
	if r.sql.due != "" {
		where += " AND not_before IS NULL"
	}
	return where, nil
}

// Count counts the rows, for Stats.InitialRows.
func (in *initialRows) Count(ctx context.Context) (int64, error) {
	qctx, cancel := context.WithTimeout(ctx, in.s.cfg.QueryTimeout)
	defer cancel()
	var total int64
	err := in.s.pool.QueryRow(qctx, in.count).Scan(&total)
	return total, err
}

// Page reads the next page of the rows, in seq order.
func (in *initialRows) Page(ctx context.Context) ([]driver.OutboxRecord, error) {
	recs, err := in.s.sweepPage(ctx, in.sel, in.after)
	if len(recs) > 0 {
		in.after = recs[len(recs)-1].Seq
	}
	return recs, err
}

// When says when the rows waited.
func (in *initialRows) When() string { return "when the slot was created" }

// Lost says what to do when their publishing stopped before the end.
func (in *initialRows) Lost() string {
	return "drop the slot (idem cdc drop-slot) and start again to publish them"
}

// Close does nothing: no transaction is held while the rows are read.
func (in *initialRows) Close() {}

// dropInitial forgets the rows not published, if any.
func (r *source) dropInitial() { r.initial = nil }

// sweepPage reads the rows of sel with its argument arg (up to sweepPage
// waiting rows with a seq above after, or delayed rows due at a time), as
// text (the simple protocol), decoded like the stream's.
func (r *source) sweepPage(ctx context.Context, sel string, arg any) ([]driver.OutboxRecord, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	rows, err := r.pool.Query(qctx, sel, pgx.QueryExecModeSimpleProtocol, arg)
	if err != nil {
		return nil, fmt.Errorf("idem: cdc: read the outbox: %w", err)
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	idx := make(map[string]int, len(fields))
	for i, f := range fields {
		idx[f.Name] = i
	}
	var recs []driver.OutboxRecord
	for rows.Next() {
		raw := rows.RawValues()
		rec, err := outboxcodec.DecodeText(func(col string) ([]byte, bool) {
			i, ok := idx[col]
			if !ok {
				return nil, false
			}
			return raw[i], true
		})
		if err != nil {
			return nil, fmt.Errorf("idem: cdc: decode an outbox row: %w", err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idem: cdc: read the outbox: %w", err)
	}
	return recs, nil
}

// DueRows reads a page of the delayed rows due at now.
func (r *source) DueRows(ctx context.Context, now time.Time) ([]driver.OutboxRecord, error) {
	return r.sweepPage(ctx, r.sql.due, now)
}

// RowsDone deletes (or with KeepRows marks published) the rows recs read
// from the table once published, and archives their events when archive
// is set, as it does the stream's: the delete and the archive in one
// statement, an event the archive cannot hold left out of it. With
// KeepRows the events are archived first: a crash before the mark
// publishes the rows again, and the archive keeps each event once.
func (r *source) RowsDone(ctx context.Context, recs []*driver.OutboxRecord, archive bool) (affected, archived int64, err error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	seqs := make([]int64, len(recs))
	for i, rec := range recs {
		seqs[i] = rec.Seq
	}
	done := r.sql.doneRows
	if r.cfg.Delete == logrelay.KeepRows {
		done = r.sql.markRows
	}
	if archive {
		if r.cfg.Delete == logrelay.DeletePublished {
			err = r.pool.QueryRow(qctx, r.sql.archiveSeqs, append([]any{seqs}, archiveArgs(recs)...)...).Scan(&affected, &archived)
			if err == nil || !dataError(err) {
				return affected, archived, err
			}
		} else {
			err = r.pool.QueryRow(qctx, r.sql.archiveRows, append([]any{[]string{}}, archiveArgs(recs)...)...).Scan(new(int64), &archived)
			if err != nil && !dataError(err) {
				return 0, 0, err
			}
		}
		if err != nil { // a value the archive refuses: one event at a time
			if archived, err = r.archiveEach(ctx, recs); err != nil {
				return 0, 0, err
			}
		}
	}
	tag, err := r.pool.Exec(qctx, done, seqs)
	return tag.RowsAffected(), archived, err
}
