package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/relay"
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
	after int64 // the last seq read
}

// initialRowsQuery returns the statement reading a page of the rows waiting
// in the outbox, or "" when there are none to look for: with Config.Delete
// = KeepRows (the table holds what the writer keeps, not what waits), and on
// a table without idem's seq, published_at and quarantined_at columns
// (Debezium's five columns only: drain it before the first start; a
// warning says so when it holds rows).
func (r *Relay) initialRowsQuery(ctx context.Context) (string, error) {
	if r.cfg.Delete != DeletePublished {
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
	return `SELECT * FROM ` + r.sql.table + ` WHERE seq > $1
		AND published_at IS NULL AND quarantined_at IS NULL ORDER BY seq LIMIT ` + fmt.Sprint(sweepPage), nil
}

// publishInitial publishes the rows waiting in the outbox when the slot was
// created, in seq order, and deletes them, before the relay reads the
// stream. A stop or a crash before the end leaves the rest in the table:
// dropping the slot (DropSlot) and starting again publishes them.
func (r *Relay) publishInitial() {
	in := r.initial
	defer r.dropInitial()
	del := `DELETE FROM ` + r.sql.table + ` WHERE seq = ANY($1::bigint[])`
	var n int64
	for {
		if r.stopping() {
			r.log.Warn("stopped before every row waiting in the outbox when the slot was created was published; they stay in the table, and the stream will not send them: drop the slot (idem cdc drop-slot) and start again to publish them",
				"published", n)
			return
		}
		recs, err := r.sweepPage(r.ctx, in.tx, in.sel, in.after)
		if err == nil && len(recs) == 0 {
			if n > 0 {
				r.log.Info("published the rows that were waiting in the outbox when the slot was created", "rows", n)
			}
			return
		}
		var done []int64
		if err == nil {
			in.after = recs[len(recs)-1].Seq
			done, err = r.publishInOrder(r.ctx, recs)
		}
		if err == nil && len(done) > 0 {
			_, err = r.pool.Exec(r.ctx, del, done)
			if err == nil {
				r.stats.deleted.Add(int64(len(done)))
				n += int64(len(done))
			}
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

// dropInitial ends the snapshot's transaction, if any.
func (r *Relay) dropInitial() {
	if r.initial != nil {
		_ = r.initial.tx.Rollback(context.Background())
		r.initial = nil
	}
}

// sweepPage reads up to sweepPage waiting rows with a seq above after, as
// text (the simple protocol), decoded like the stream's.
func (r *Relay) sweepPage(ctx context.Context, tx pgx.Tx, sel string, after int64) ([]driver.OutboxRecord, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	rows, err := tx.Query(qctx, sel, pgx.QueryExecModeSimpleProtocol, after)
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
		rec, err := postgres.DecodeOutboxText(func(col string) ([]byte, bool) {
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

// publishInOrder publishes recs (in seq order) in rounds, round k holding
// the k-th row of each aggregate and going to the broker once round k-1 was
// confirmed; failed messages are retried with backoff until ctx ends. Rows
// that cannot become messages are quarantined. It returns the seqs of the
// rows published.
func (r *Relay) publishInOrder(ctx context.Context, recs []driver.OutboxRecord) ([]int64, error) {
	type item struct {
		seq int64
		msg idem.Message
	}
	var rounds [][]item
	depth := map[string]int{}
	for _, rec := range recs {
		msg, err := relay.RecordMessage(rec)
		if err != nil {
			r.stats.unreadable.Add(1)
			if _, qerr := r.pool.Exec(ctx, r.sql.quarantine, rec.Seq, err.Error()); qerr != nil {
				return nil, fmt.Errorf("idem: cdc: quarantine row seq %d: %w", rec.Seq, qerr)
			}
			r.stats.quarantined.Add(1)
			r.log.Error("quarantined an outbox row that cannot be published (idem failed list --relay)",
				"seq", rec.Seq, "id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "error", err)
			continue
		}
		k := rec.AggregateType + "\x00" + rec.AggregateID
		d := depth[k]
		depth[k] = d + 1
		if d == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[d] = append(rounds[d], item{rec.Seq, msg})
	}
	var done []int64
	for _, round := range rounds {
		if r.stopping() {
			return done, nil // the rest waits for the next start
		}
		failures := 0
		for len(round) > 0 {
			msgs := make([]idem.Message, len(round))
			for i, it := range round {
				msgs[i] = it.msg
			}
			pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
			r.stats.inFlight.Store(int64(len(msgs)))
			err := r.pub.Publish(pctx, msgs)
			r.stats.inFlight.Store(0)
			cancel()
			r.stats.calls.Add(1)
			var failed []item
			var firstErr error
			for i, e := range broker.Results(err, len(msgs)) {
				if e != nil {
					failed = append(failed, round[i])
					firstErr = cmpErr(firstErr, e)
					continue
				}
				done = append(done, round[i].seq)
			}
			r.stats.published.Add(int64(len(round) - len(failed)))
			if len(failed) < len(round) {
				r.errs.publish.OK(ctx)
			}
			round = failed
			if len(round) == 0 {
				break
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			failures++
			r.stats.failures.Add(1)
			delay := r.backoff(failures)
			r.errs.publish.Warn(ctx, "publishing the rows already in the outbox failed; retrying", firstErr, "messages", len(round),
				"retry_in", delay.Round(time.Millisecond))
			select {
			case <-time.After(delay):
			case <-r.base.Stopping():
				return done, nil
			case <-ctx.Done():
				return nil, errors.Join(ctx.Err(), firstErr)
			}
		}
	}
	return done, nil
}

// stopping reports whether Stop was called.
func (r *Relay) stopping() bool {
	select {
	case <-r.base.Stopping():
		return true
	default:
		return false
	}
}
