package cdc

import (
	"context"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/ctxsleep"
)

// Delayed rows (idem.Event.NotBefore): the stream skips an insert whose
// not_before is set, and the row waits in the table, where the relay that
// holds the slot looks for the due ones every Config.DueInterval, publishes
// them through the ordered publisher like the initial sweep (refused ones
// quarantined after Config.QuarantineAfter), then deletes them (with
// KeepRows, marks them published) and archives them as the stream's rows
// (Config.ArchiveRetention). A crash before the delete leaves the row
// in the table: the next relay publishes it again. The stream's position
// never waits for a delayed row, and a delayed row holds back nothing of its
// aggregate.

// dueLoop publishes the due delayed rows until ctx ends.
func (r *Relay) dueLoop(ctx context.Context) {
	for {
		r.publishDue(ctx)
		if !ctxsleep.Sleep(ctx, r.cfg.DueInterval) {
			return
		}
	}
}

// publishDue publishes the delayed rows due now, page by page, and deletes
// (or marks) them. A failure is logged and left to the next round.
func (r *Relay) publishDue(ctx context.Context) {
	for ctx.Err() == nil && !r.stopping() {
		recs, err := r.sweepPage(ctx, r.pool, r.sql.due, r.cfg.Now().UTC())
		if err != nil {
			if ctx.Err() == nil {
				r.errs.publish.Warn(ctx, "reading the delayed rows that are due failed; trying again", err)
			}
			return
		}
		if len(recs) == 0 {
			return
		}
		done, published, err := r.publishInOrder(ctx, recs, false)
		if err != nil {
			return // stopping: what is left waits in the table
		}
		if len(done) > 0 {
			affected, err := r.finishDue(ctx, done, published)
			if err != nil {
				if ctx.Err() == nil {
					// Published and still in the table: published again
					// at the next round (consumers deduplicate).
					r.errs.delete.Warn(ctx, "deleting published delayed rows failed; they will be published again", err, "rows", len(done))
				}
				return
			}
			r.stats.due.Add(int64(len(done)))
			if r.cfg.Delete == DeletePublished {
				r.stats.deleted.Add(affected)
			}
		}
		if len(recs) < sweepPage || len(done) == 0 {
			return
		}
	}
}

// finishDue deletes (or with KeepRows marks published) the delayed rows of
// seqs done once published, and archives their events (published) when
// the relay archives, as it does the stream's: the delete and the archive
// in one statement, an event the archive cannot hold left out of it. It
// returns the rows deleted or marked.
func (r *Relay) finishDue(ctx context.Context, done []int64, published []*driver.OutboxRecord) (int64, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	if !r.archiving {
		tag, err := r.pool.Exec(qctx, r.sql.doneDue, done)
		return tag.RowsAffected(), err
	}
	var affected, archived int64
	var err error
	if r.cfg.Delete == DeletePublished {
		err = r.pool.QueryRow(qctx, r.sql.archiveSeqs, append([]any{done}, archiveArgs(published)...)...).Scan(&affected, &archived)
		if err == nil || !dataError(err) {
			r.stats.archived.Add(archived)
			return affected, err
		}
	} else {
		// Archived first: a crash before the mark publishes the rows
		// again, and the archive keeps each event once.
		err = r.pool.QueryRow(qctx, r.sql.archiveRows, append([]any{[]string{}}, archiveArgs(published)...)...).Scan(new(int64), &archived)
		if err != nil && !dataError(err) {
			return 0, err
		}
	}
	if err != nil { // a value the archive refuses: one event at a time
		if archived, err = r.archiveEach(ctx, published); err != nil {
			return 0, err
		}
	}
	r.stats.archived.Add(archived)
	tag, err := r.pool.Exec(qctx, r.sql.doneDue, done)
	return tag.RowsAffected(), err
}
