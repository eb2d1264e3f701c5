package binlog

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/outboxcodec"
	"github.com/idem-go/idem/relay/internal/ordered"
	"github.com/idem-go/idem/relay/internal/sendspan"
)

// Delayed rows (idem.Event.NotBefore): the stream skips an insert whose
// not_before is set, and the row waits in the table, where the relay that
// holds the outbox looks for the due ones every Config.DueInterval,
// publishes them through the ordered publisher (refused ones quarantined
// after Config.QuarantineAfter, like the stream's), then deletes them
// (with KeepRows, marks them published) and archives them as the stream's
// rows (Config.ArchiveRetention). They never go through the
// pipeline: the stored position does not wait for them, and a crash before
// the delete leaves the row in the table, published again by the next
// relay. A delayed row holds back nothing of its aggregate.

// dueLoop publishes the due delayed rows until ctx ends.
func (r *Relay) dueLoop(ctx context.Context) {
	for {
		r.publishDue(ctx)
		if !ctxsleep.Sleep(ctx, r.cfg.DueInterval) {
			return
		}
	}
}

// publishDue publishes the delayed rows due now, a page at a time, and
// deletes (or marks) them. A failure is logged and left to the next round.
func (r *Relay) publishDue(ctx context.Context) {
	for ctx.Err() == nil {
		select {
		case <-r.base.Stopping():
			return
		default:
		}
		recs, err := r.dueRows(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.errs.publish.Warn(ctx, "reading the delayed rows that are due failed; trying again", err)
			}
			return
		}
		if len(recs) == 0 {
			return
		}
		ids, published := r.publishRows(ctx, recs)
		if ctx.Err() != nil {
			return // what is left waits in the table
		}
		if len(ids) > 0 {
			err := r.finishDue(ctx, ids, published)
			if err != nil {
				if ctx.Err() == nil {
					// Published and still in the table: published again at
					// the next round (consumers deduplicate).
					r.errs.publish.Warn(ctx, "deleting published delayed rows failed; they will be published again", err, "rows", len(ids))
				}
				return
			}
			r.stats.due.Add(int64(len(ids)))
		}
		if len(recs) < initialPage || len(ids) == 0 {
			return
		}
	}
}

// finishDue deletes (or with KeepRows marks published) the delayed rows of
// ids once published, and archives their events (published) when the
// relay archives, as it does the stream's: the delete and the archive in
// one transaction (deleteRows).
func (r *Relay) finishDue(ctx context.Context, ids []string, published []*driver.OutboxRecord) error {
	if !r.archiving {
		published = nil
	}
	if r.cfg.Delete == DeletePublished {
		return r.deleteRows(ctx, ids, published)
	}
	// KeepRows: archived first (a crash before the mark publishes the
	// rows again, and the archive keeps each event once), then marked.
	if len(published) > 0 {
		if err := r.deleteRows(ctx, nil, published); err != nil {
			return err
		}
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	_, err := r.db.ExecContext(qctx, fmt.Sprintf(r.sql.doneDue, placeholders(len(ids))), args...)
	return err
}

// dueRows reads a page of the delayed rows due at the relay's clock.
func (r *Relay) dueRows(ctx context.Context) ([]driver.OutboxRecord, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	rows, err := r.db.QueryContext(qctx, r.sql.due, r.cfg.Now().UTC())
	if err != nil {
		return nil, err
	}
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

// publishRows publishes recs (in seq order) in per-aggregate order,
// failures retried, refusals quarantined after Config.QuarantineAfter, rows
// that cannot become messages quarantined at once. It returns the ids of
// the rows published, and the rows; a Stop ends it early.
func (r *Relay) publishRows(ctx context.Context, recs []driver.OutboxRecord) ([]string, []*driver.OutboxRecord) {
	entries := make([]*ordered.Entry, 0, len(recs))
	for i, rec := range recs {
		msg, err := outboxcodec.Message(rec)
		if err != nil {
			r.stats.unreadable.Add(1)
			if qerr := r.quarantine(ctx, rec, err); qerr != nil {
				r.log.Warn("quarantining a delayed row that cannot be published failed; trying again at the next round", "id", rec.RawID, "error", qerr)
			}
			continue
		}
		entries = append(entries, &ordered.Entry{Key: rec.AggregateType + "\x00" + rec.AggregateID, Msg: msg,
			Refusals: rec.Attempts, Ref: i})
	}
	pub := ordered.New(ctx, ordered.Config{
		Publish: func(ctx context.Context, batch []*ordered.Entry, msgs []idem.Message) error {
			r.stats.calls.Add(1)
			spans := r.tracing.Start(ctx, msgs, func(j int) (int64, int) {
				return recs[batch[j].Ref].Seq, batch[j].Refusals + 1
			})
			err := r.pub.Publish(ctx, msgs)
			sendspan.End(spans, err)
			return err
		},
		Calls:           4,
		MinCall:         r.cfg.BatchSize,
		MaxCall:         r.cfg.BatchSize,
		Timeout:         r.cfg.PublishTimeout,
		QuarantineAfter: r.cfg.QuarantineAfter,
		Mode:            ordered.Retry,
		Halt:            r.base.Stopping(),
		Backoff:         r.backoff,
		Park: func(ctx context.Context, e *ordered.Entry) error {
			rec := &recs[e.Ref]
			err := r.park(ctx, rec, e.Refusals, e.Err)
			if err != nil && ctx.Err() == nil {
				r.log.Warn("quarantining a delayed row the broker refused failed; publishing it again", "id", rec.RawID, "error", err)
			}
			return err
		},
		Answered: func(int) { r.errs.publish.OK(ctx) },
		Failed: func(n, _ int, err error, wait time.Duration) {
			r.stats.failures.Add(1)
			r.errs.publish.Warn(ctx, "publishing delayed rows that are due failed; retrying", err, "messages", n,
				"retry_in", wait.Round(time.Millisecond))
		},
	})
	pub.Add(entries...)
	pub.Wait()
	var ids []string
	var published []*driver.OutboxRecord
	for _, e := range entries {
		if e.Outcome == ordered.Published {
			ids = append(ids, recs[e.Ref].RawID)
			published = append(published, &recs[e.Ref])
		}
	}
	r.stats.published.Add(int64(len(ids)))
	return ids, published
}
