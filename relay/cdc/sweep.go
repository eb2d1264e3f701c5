package cdc

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
	"github.com/idem-go/idem/internal/progress"
	"github.com/idem-go/idem/relay/internal/ordered"
	"github.com/idem-go/idem/relay/internal/sendspan"
)

// sweepPage is the number of rows read, published and deleted at a time
// among those waiting when the slot was created.
const sweepPage = 1000

// sweepColumnsSQL counts the columns the initial rows need: seq for their
// order, published_at and quarantined_at to skip the rows a polling relay
// published or set aside.
const sweepColumnsSQL = `SELECT count(*) FROM pg_attribute
	WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped
	AND attname IN ('seq', 'published_at', 'quarantined_at')`

// initialRows are the rows waiting in the outbox when the slot was created:
// a slot streams only what commits after its creation, so they are read in
// the snapshot of its consistent point (exactly those the stream will not
// send) and published before the stream.
type initialRows struct {
	tx    pgx.Tx // repeatable read, in the slot's snapshot
	sel   string
	count string // counts them, for the progress lines
	after int64  // the last seq read
}

// initialRowsQuery returns the statement reading a page of the rows waiting
// in the outbox, and the one counting them, or "" when there are none to
// look for: with Config.Delete
// = KeepRows (the table holds what the writer keeps, not what waits), and on
// a table without idem's seq, published_at and quarantined_at columns
// (Debezium's five columns only: drain it before the first start; a
// warning says so when it holds rows).
func (r *Relay) initialRowsQuery(ctx context.Context) (sel, count string, err error) {
	if r.cfg.Delete != DeletePublished {
		return "", "", nil
	}
	var cols int
	if err := r.pool.QueryRow(ctx, sweepColumnsSQL, r.sql.table).Scan(&cols); err != nil {
		return "", "", fmt.Errorf("idem: cdc: read the outbox's columns: %w", err)
	}
	if cols != 3 {
		var held bool
		if err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+r.sql.table+`)`).Scan(&held); err == nil && held {
			r.log.Warn("the outbox held rows when the slot was created; they are not in its stream, and without idem's seq, published_at and quarantined_at columns the relay cannot tell which wait: publish them another way (the polling relay, idem relay), or delete them",
				"table", r.sql.table)
		}
		return "", "", nil
	}
	// Delayed rows wait in the table for their time (publishDue).
	where := ` published_at IS NULL AND quarantined_at IS NULL`
	if r.sql.due != "" {
		where += " AND not_before IS NULL"
	}
	return `SELECT * FROM ` + r.sql.table + ` WHERE seq > $1 AND` + where + ` ORDER BY seq LIMIT ` + fmt.Sprint(sweepPage),
		`SELECT count(*) FROM ` + r.sql.table + ` WHERE` + where, nil
}

// publishInitial publishes the rows waiting in the outbox when the slot was
// created, in seq order, and deletes them, before the relay reads the
// stream. A stop or a crash before the end leaves the rest in the table:
// dropping the slot (DropSlot) and starting again publishes them.
func (r *Relay) publishInitial() {
	in := r.initial
	defer r.dropInitial()
	del := `DELETE FROM ` + r.sql.table + ` WHERE seq = ANY($1::bigint[])`
	rep := r.initialProgress(in)
	quarantined := r.stats.quarantined.Load()
	var n int64
	for {
		if r.stopping() {
			r.log.Warn("stopped before every row waiting in the outbox when the slot was created was published; they stay in the table, and the stream will not send them: drop the slot (idem cdc drop-slot) and start again to publish them",
				"published", n)
			return
		}
		recs, err := r.sweepPage(r.ctx, in.tx, in.sel, in.after)
		if err == nil && len(recs) == 0 {
			if rep.Done() > 0 {
				rep.Finish(progress.Count{Name: "published", N: n}, progress.Count{Name: "quarantined", N: r.stats.quarantined.Load() - quarantined})
			}
			return
		}
		var done []int64
		var published []*driver.OutboxRecord
		if err == nil {
			in.after = recs[len(recs)-1].Seq
			done, published, err = r.publishInOrder(r.ctx, recs, true)
		}
		if err == nil && len(done) > 0 {
			archived := int64(0)
			if r.archiving {
				// Deleted and archived at once, as the stream's rows; an
				// event the archive cannot hold leaves the others archived
				// one by one before the rows are deleted.
				err = r.pool.QueryRow(r.ctx, r.sql.archiveSeqs, append([]any{done}, archiveArgs(published)...)...).Scan(new(int64), &archived)
				if err != nil && dataError(err) {
					archived, err = r.archiveEach(r.ctx, published)
					if err == nil {
						_, err = r.pool.Exec(r.ctx, del, done)
					}
				}
			} else {
				_, err = r.pool.Exec(r.ctx, del, done)
			}
			r.stats.archived.Add(archived)
			if err == nil {
				r.stats.deleted.Add(int64(len(done)))
				n += int64(len(done))
			}
		}
		if err == nil {
			// Every row of the page is published or quarantined.
			r.stats.initialDone.Add(int64(len(recs)))
			rep.Add(int64(len(recs)))
		}
		if err != nil {
			if r.ctx.Err() == nil {
				r.log.Error("publishing the rows waiting in the outbox when the slot was created failed; they stay in the table, and the stream will not send them: drop the slot (idem cdc drop-slot) and start again to publish them",
					"published", n, "error", err)
			}
			return
		}
	}
}

// initialProgress counts the rows of in, for Stats.InitialRows, and
// returns the report of their publishing, logged every
// Config.ProgressInterval. The count runs in a savepoint of the snapshot's
// transaction, without QueryTimeout (a cancelled statement would end the
// transaction, and the snapshot with it); one that fails leaves the total
// unknown.
func (r *Relay) initialProgress(in *initialRows) *progress.Reporter {
	var total int64
	err := pgx.BeginFunc(r.ctx, in.tx, func(sp pgx.Tx) error { return sp.QueryRow(r.ctx, in.count).Scan(&total) })
	if err != nil && r.ctx.Err() == nil {
		r.log.Warn("counting the rows waiting in the outbox when the slot was created failed; publishing them without a total", "error", err)
	}
	r.stats.initialRows.Store(total)
	r.stats.initialDone.Store(0)
	if total > 0 {
		r.log.Info("publishing the rows that were waiting in the outbox when the slot was created, before the stream", "rows", total)
	}
	return progress.New(progress.Config{Name: "initial rows", Unit: "rows", Total: total, Logger: r.log, Interval: r.cfg.ProgressInterval,
		Running:  "publishing the rows that were waiting in the outbox when the slot was created",
		Finished: "published the rows that were waiting in the outbox when the slot was created"})
}

// dropInitial ends the snapshot's transaction, if any.
func (r *Relay) dropInitial() {
	if r.initial != nil {
		_ = r.initial.tx.Rollback(context.Background())
		r.initial = nil
	}
}

// querier is a transaction or the pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// sweepPage reads the rows of sel with its argument arg (up to sweepPage
// waiting rows with a seq above after, or delayed rows due at a time), as
// text (the simple protocol), decoded like the stream's.
func (r *Relay) sweepPage(ctx context.Context, q querier, sel string, arg any) ([]driver.OutboxRecord, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	rows, err := q.Query(qctx, sel, pgx.QueryExecModeSimpleProtocol, arg)
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

// publishInOrder publishes recs (in seq order) through the relays' ordered
// publisher, like the stream's messages: in per-aggregate order, several
// calls in flight, failures retried with backoff, and a row the broker
// refuses Config.QuarantineAfter times quarantined in the table (the later
// rows of its aggregate go on). Rows that cannot become messages are
// quarantined at once. It returns the seqs of the rows published, and the
// rows, in seq order; a Stop ends it early, and what is left waits for the
// next start. Stats.InFlight counts its messages when inFlight says so:
// not while the stream's pipeline, which sets that figure, runs beside it.
func (r *Relay) publishInOrder(ctx context.Context, recs []driver.OutboxRecord, inFlight bool) ([]int64, []*driver.OutboxRecord, error) {
	entries := make([]*ordered.Entry, 0, len(recs))
	for i, rec := range recs {
		msg, err := outboxcodec.Message(rec)
		if err != nil {
			r.stats.unreadable.Add(1)
			if _, qerr := r.pool.Exec(ctx, r.sql.quarantine, rec.Seq, err.Error()); qerr != nil {
				return nil, nil, fmt.Errorf("idem: cdc: quarantine row seq %d: %w", rec.Seq, qerr)
			}
			r.stats.quarantined.Add(1)
			r.log.Error("quarantined an outbox row that cannot be published (idem failed list --relay)",
				"seq", rec.Seq, "id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "error", err)
			continue
		}
		entries = append(entries, &ordered.Entry{Key: rec.AggregateType + "\x00" + rec.AggregateID, Msg: msg,
			Refusals: rec.Attempts, Ref: i})
	}
	pub := ordered.New(ctx, ordered.Config{
		Publish: func(ctx context.Context, batch []*ordered.Entry, msgs []idem.Message) error {
			if inFlight {
				n := int64(len(msgs))
				r.stats.inFlight.Add(n)
				defer r.stats.inFlight.Add(-n)
			}
			r.stats.calls.Add(1)
			spans := r.tracing.Start(ctx, msgs, func(j int) (int64, int) {
				return recs[batch[j].Ref].Seq, batch[j].Refusals + 1
			})
			err := r.pub.Publish(ctx, msgs)
			sendspan.End(spans, err)
			return err
		},
		Calls:           sweepCalls,
		MinCall:         sweepMinCall,
		Timeout:         r.cfg.PublishTimeout,
		QuarantineAfter: r.cfg.QuarantineAfter,
		Mode:            ordered.Retry,
		Halt:            r.base.Stopping(),
		Backoff:         r.backoff,
		Park: func(ctx context.Context, e *ordered.Entry) error {
			rec := &recs[e.Ref]
			qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
			defer cancel()
			reason := fmt.Sprintf("refused by the broker on %d attempts; last: %v", e.Refusals, e.Err)
			if _, err := r.pool.Exec(qctx, r.sql.quarantineAfter, rec.Seq, reason, e.Refusals-rec.Attempts); err != nil {
				if ctx.Err() == nil {
					r.log.Warn("quarantining a row the broker refused failed; publishing it again", "seq", rec.Seq, "error", err)
				}
				return err
			}
			r.stats.quarantined.Add(1)
			r.log.Error("quarantined an outbox row the broker refused on every attempt; the later rows of its aggregate go on (idem failed list --relay shows it, idem failed retry --relay publishes it again)",
				"seq", rec.Seq, "id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID,
				"event", rec.Type, "attempts", e.Refusals, "error", e.Err)
			return nil
		},
		Answered: func(int) { r.errs.publish.OK(ctx) },
		Failed: func(n, _ int, err error, wait time.Duration) {
			r.stats.failures.Add(1)
			r.errs.publish.Warn(ctx, "publishing the rows already in the outbox failed; retrying", err, "messages", n,
				"retry_in", wait.Round(time.Millisecond))
		},
	})
	pub.Add(entries...)
	pub.Wait()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	var done []int64
	var published []*driver.OutboxRecord
	for _, e := range entries {
		if e.Outcome == ordered.Published {
			done = append(done, recs[e.Ref].Seq)
			published = append(published, &recs[e.Ref])
		}
	}
	r.stats.published.Add(int64(len(done)))
	return done, published, nil
}

// The calls in flight of the initial sweep, and the fewest messages in
// each when that many are ready.
const (
	sweepCalls   = 4
	sweepMinCall = 64
)

// stopping reports whether Stop was called.
func (r *Relay) stopping() bool {
	select {
	case <-r.base.Stopping():
		return true
	default:
		return false
	}
}
