package logengine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/outboxcodec"
	"github.com/idem-go/idem/internal/progress"
	"github.com/idem-go/idem/relay/internal/ordered"
	"github.com/idem-go/idem/relay/internal/sendspan"
	"github.com/idem-go/idem/relay/logrelay"
)

// The rows published from the table rather than from the log: those
// waiting when the relay first reads the log (Initial), and the delayed
// rows once due. Both go through the ordered publisher like the log's
// messages (per-aggregate order, several calls in flight, failures
// retried, a row the broker refuses Config.QuarantineAfter times
// quarantined: the later rows of its aggregate go on), then the adapter
// deletes them (Table.RowsDone), archiving them with the same rules as the
// log's. A crash before the delete leaves them in the table, published
// again by the next relay.

// errStopped ends the publishing of the initial rows at a Stop.
var errStopped = errors.New("stopped")

// publishInitial publishes the rows of in, page by page, before the log.
// A Stop or a failure before the end leaves the rest in the table and ends
// the session.
func (r *Relay) publishInitial(ctx context.Context, in Initial) error {
	total, err := in.Count(ctx)
	if err != nil && ctx.Err() == nil {
		r.log.Warn("counting the rows that were waiting in the outbox "+in.When()+" failed; publishing them without a total", "error", err)
	}
	r.C.InitialRows.Store(total)
	r.C.InitialDone.Store(0)
	if total > 0 {
		r.log.Info("publishing the rows that were waiting in the outbox "+in.When()+", before the log", "rows", total)
	}
	rep := progress.New(progress.Config{Name: "initial rows", Unit: "rows", Total: total, Logger: r.log, Interval: r.cfg.ProgressInterval,
		Running:  "publishing the rows that were waiting in the outbox " + in.When(),
		Finished: "published the rows that were waiting in the outbox " + in.When()})
	quarantined := r.C.Quarantined.Load()
	var n, seen int64
	for {
		// The next page is read even at a Stop: when there is none, the
		// session goes on to Start, which makes the first start's
		// position durable, and the next start does not take the rows
		// from a new snapshot.
		recs, err := in.Page(ctx)
		if err == nil && len(recs) > 0 && r.stopping() {
			err = errStopped
		}
		if err == nil && len(recs) == 0 {
			r.C.InitialRows.Store(max(total, seen))
			if rep.Done() > 0 {
				rep.Finish(progress.Count{Name: "published", N: n}, progress.Count{Name: "quarantined", N: r.C.Quarantined.Load() - quarantined})
			}
			return nil
		}
		var published []*driver.OutboxRecord
		if err == nil {
			published, err = r.publishRows(ctx, recs, true)
		}
		if err == nil && len(published) > 0 {
			var affected, archived int64
			affected, archived, err = r.src.RowsDone(ctx, published, r.Archiving())
			r.C.Archived.Add(archived)
			r.C.Deleted.Add(affected)
		}
		if err != nil {
			if ctx.Err() == nil {
				what := "publishing the rows that were waiting in the outbox " + in.When() + " stopped before the end"
				if lost := in.Lost(); lost != "" {
					r.log.Warn(what+"; they stay in the table, and the log will not send them: "+lost, "published", n, "error", err)
				} else {
					r.log.Info(what+"; the next start publishes the rest", "published", n, "error", err)
				}
			}
			return fmt.Errorf("idem: %s: publish the rows waiting in the outbox: %w", r.cfg.Name, err)
		}
		// Every row of the page is published or quarantined.
		n += int64(len(published))
		seen += int64(len(recs))
		r.C.InitialDone.Add(int64(len(recs)))
		rep.Add(int64(len(recs)))
	}
}

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
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		recs, err := r.src.DueRows(qctx, r.cfg.Now().UTC())
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.errs.publish.Warn(ctx, "reading the delayed rows that are due failed; trying again", err)
			}
			return
		}
		if len(recs) == 0 || !r.waitUnpaused(ctx, r.base.Stopping()) {
			return
		}
		published, err := r.publishRows(ctx, recs, false)
		if err != nil {
			return // stopping: what is left waits in the table
		}
		if len(published) > 0 {
			affected, archived, err := r.src.RowsDone(ctx, published, r.Archiving())
			r.C.Archived.Add(archived)
			if err != nil {
				if ctx.Err() == nil {
					// Published and still in the table: published again
					// at the next round (consumers deduplicate).
					r.errs.delete.Warn(ctx, "deleting published delayed rows failed; they will be published again", err, "rows", len(published))
				}
				return
			}
			r.C.Due.Add(int64(len(published)))
			if r.cfg.Delete == logrelay.DeletePublished {
				r.C.Deleted.Add(affected)
			}
		}
		if len(recs) < DuePage || len(published) == 0 {
			return
		}
	}
}

// DuePage is the most rows Table.DueRows reads at a time; a full page is
// followed by the next at once.
const DuePage = 1000

// The calls in flight when publishing rows from the table, and the fewest
// messages in each when that many are ready.
const (
	tableCalls   = 4
	tableMinCall = 64
)

// publishRows publishes recs (in seq order) through the relays' ordered
// publisher, like the log's messages. Rows that cannot become messages are
// quarantined at once. It returns the rows published, in seq order; a Stop
// ends it early, and what is left waits for the next start.
// Stats.InFlight counts its messages when inFlight says so: not while the
// log's pipeline, which sets that figure, runs beside it.
func (r *Relay) publishRows(ctx context.Context, recs []driver.OutboxRecord, inFlight bool) ([]*driver.OutboxRecord, error) {
	entries := make([]*ordered.Entry, 0, len(recs))
	for i := range recs {
		rec := &recs[i]
		msg, err := outboxcodec.Message(*rec)
		if err != nil {
			if err := r.Unreadable(ctx, rec, err); err != nil {
				return nil, err
			}
			continue
		}
		entries = append(entries, &ordered.Entry{Key: rec.AggregateType + "\x00" + rec.AggregateID, Msg: msg,
			Refusals: rec.Attempts, Ref: i})
	}
	pub := ordered.New(ctx, ordered.Config{
		Publish: func(ctx context.Context, batch []*ordered.Entry, msgs []idem.Message) error {
			if inFlight {
				n := int64(len(msgs))
				r.C.InFlight.Add(n)
				defer r.C.InFlight.Add(-n)
			}
			r.C.Calls.Add(1)
			spans := r.cfg.Tracing.Start(ctx, msgs, func(j int) (int64, int) {
				return recs[batch[j].Ref].Seq, batch[j].Refusals + 1
			})
			err := r.cfg.Publisher.Publish(ctx, msgs)
			sendspan.End(spans, err)
			return err
		},
		Calls:           tableCalls,
		MinCall:         min(tableMinCall, r.cfg.BatchSize),
		MaxCall:         r.cfg.BatchSize,
		Timeout:         r.cfg.PublishTimeout,
		QuarantineAfter: r.cfg.QuarantineAfter,
		Mode:            ordered.Retry,
		Halt:            r.base.Stopping(),
		Backoff:         r.Backoff,
		Park: func(ctx context.Context, e *ordered.Entry) error {
			rec := &recs[e.Ref]
			return r.park(ctx, Refused{Rec: rec, Table: true, Refusals: e.Refusals, Earlier: rec.Attempts, Err: e.Err})
		},
		Answered: func(int) { r.errs.publish.OK(ctx) },
		Failed: func(n, _ int, err error, wait time.Duration) {
			r.C.Failures.Add(1)
			r.errs.publish.Warn(ctx, "publishing rows from the outbox table failed; retrying", err, "messages", n,
				"retry_in", wait.Round(time.Millisecond))
		},
	})
	pub.Add(entries...)
	pub.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var published []*driver.OutboxRecord
	for _, e := range entries {
		if e.Outcome == ordered.Published {
			published = append(published, &recs[e.Ref])
		}
	}
	r.C.Published.Add(int64(len(published)))
	return published, nil
}

// park quarantines a message the broker refused on Config.QuarantineAfter
// attempts, through the adapter: its row gets quarantined_at and
// last_error, or, for a message without a row, a quarantined row is
// written, where "idem failed list|show|retry|remove --relay" find it. A
// table without idem's columns cannot hold it: the message is then logged
// at error level with its whole content, and skipped. An error leaves the
// message to be published again.
func (r *Relay) park(ctx context.Context, p Refused) error {
	rec := p.Rec
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	parked, err := r.src.Park(qctx, p, r.notify(rec, RefusedError(p), p.Refusals))
	switch {
	case err != nil:
		if ctx.Err() == nil {
			r.log.Warn("quarantining a message the broker refused failed; publishing it again", "id", rec.RawID, "error", err)
		}
		return err
	case !parked:
		r.C.Unreadable.Add(1)
		r.log.Error("the broker refused a message on every attempt, and the outbox has no quarantined_at, last_error and attempts columns to park it in; skipped",
			"id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "type", rec.Type,
			"payload", Quote(rec.Payload), "headers", Quote(rec.RawHeaders), "attempts", p.Refusals, "error", p.Err)
	default:
		r.C.Quarantined.Add(1)
		r.log.Error("quarantined a message the broker refused on every attempt; the later messages of its aggregate go on (idem failed list --relay shows it, idem failed retry --relay publishes it again)",
			"id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "type", rec.Type,
			"attempts", p.Refusals, "error", p.Err)
	}
	return nil
}

// RefusedError is the last_error of a message the broker refused.
func RefusedError(p Refused) string {
	return fmt.Sprintf("refused by the broker on %d attempts; last: %v", p.Refusals, p.Err)
}

// Unreadable quarantines, through the adapter, a row that cannot become a
// message, in place (Table.Quarantine); a row that cannot be quarantined
// is logged at error level with its content. It fails only when the
// database does.
func (r *Relay) Unreadable(ctx context.Context, rec *driver.OutboxRecord, reason error) error {
	r.C.Unreadable.Add(1)
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	ok, err := r.src.Quarantine(qctx, rec, reason, r.notify(rec, reason.Error(), rec.Attempts+1))
	switch {
	case err != nil:
		return fmt.Errorf("idem: %s: quarantine a row that cannot be published: %w", r.cfg.Name, err)
	case ok:
		r.C.Quarantined.Add(1)
		r.log.Error("quarantined an outbox row that cannot be published (idem failed list --relay)",
			"seq", rec.Seq, "id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "error", reason)
	default:
		r.log.Error("an outbox row cannot be published, nor quarantined (deleted since, or a table without idem's columns); skipped",
			"seq", rec.Seq, "id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID,
			"type", rec.Type, "payload", Quote(rec.Payload), "headers", Quote(rec.RawHeaders), "error", reason)
	}
	return nil
}

// Quote returns b quoted for a log line, cut after 1,000 bytes.
func Quote(b []byte) string {
	if len(b) > 1000 {
		return strconv.Quote(string(b[:1000])) + "..."
	}
	return strconv.Quote(string(b))
}

// NewRow returns the row of rec to publish, or the reason it cannot
// become a message.
func NewRow(rec driver.OutboxRecord, del string) (Row, error) {
	msg, err := outboxcodec.Message(rec)
	if err != nil {
		return Row{}, err
	}
	return Row{Rec: &rec, Msg: msg, Delete: del}, nil
}

// notify returns the Notify of the quarantine of rec for errText after
// attempts, or nil when there is no hook or rec is itself a notice.
func (r *Relay) notify(rec *driver.OutboxRecord, errText string, attempts int) Notify {
	if r.cfg.OnQuarantine == nil || idem.IsFailureNotice(rec.Type) {
		return nil
	}
	return func(ctx context.Context, ex driver.Executor, seq int64) error {
		q := *rec
		q.Seq = seq
		n := logrelay.QuarantineNotice(r.setup.Outbox, q, errText)
		n.Attempts = attempts
		if err := r.cfg.OnQuarantine(ctx, ex, n); err != nil {
			return fmt.Errorf("idem: %s: quarantine hook: %w", r.cfg.Name, err)
		}
		return nil
	}
}
