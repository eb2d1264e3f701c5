package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/relay"
)

// sweepPage is the number of rows a sweep reads, publishes and deletes at a
// time.
const sweepPage = 1000

// sweepColumnsSQL counts the columns a sweep needs: seq for the order,
// published_at and quarantined_at to skip the rows a polling relay published
// or set aside.
const sweepColumnsSQL = `SELECT count(*) FROM pg_attribute
	WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped
	AND attname IN ('seq', 'published_at', 'quarantined_at')`

// slotActiveSQL says whether a process reads the slot.
const slotActiveSQL = `SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)`

// sweep publishes the rows that are in the outbox when the relay starts, in
// seq order, and deletes them: rows committed before the slot existed (a
// table the polling relay served, rows written before the first start) are
// in no stream the slot sends. Rows the slot sends as well are published
// once: the relay remembers what it swept and skips those inserts in the
// stream until its position passes the end of the sweep (a crash in
// between publishes them twice, which at-least-once allows), and a crash
// during the sweep leaves its unpublished rows for the next start's sweep. It returns the number of rows published; it does nothing when the
// relay keeps rows (Config.Delete = KeepRows: rows in the table are not
// waiting then), when the table lacks idem's seq, published_at and
// quarantined_at columns, or when another process reads the slot (the
// relay sweeps once it holds it).
func (r *Relay) sweep(ctx context.Context) (swept bool, n int64, err error) {
	if r.cfg.Delete != DeletePublished {
		return true, 0, nil
	}
	var cols int
	if err := r.pool.QueryRow(ctx, sweepColumnsSQL, r.sql.table).Scan(&cols); err != nil {
		return false, 0, fmt.Errorf("idem: cdc: read the outbox's columns: %w", err)
	}
	if cols != 3 {
		return true, 0, nil
	}
	var active bool
	if err := r.pool.QueryRow(ctx, slotActiveSQL, r.cfg.Slot).Scan(&active); err != nil {
		return false, 0, fmt.Errorf("idem: cdc: read slot %s: %w", r.cfg.Slot, err)
	}
	if active {
		return false, 0, nil
	}
	var last int64
	if err := r.pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM `+r.sql.table).Scan(&last); err != nil {
		return false, 0, fmt.Errorf("idem: cdc: read the outbox: %w", err)
	}
	sel := `SELECT * FROM ` + r.sql.table + ` WHERE seq > $1 AND seq <= $2
		AND published_at IS NULL AND quarantined_at IS NULL ORDER BY seq LIMIT ` + fmt.Sprint(sweepPage)
	del := `DELETE FROM ` + r.sql.table + ` WHERE seq = ANY($1::bigint[])`
	after := int64(0)
	for {
		if r.stopping() {
			return false, n, errStopping
		}
		recs, err := r.sweepPage(ctx, sel, after, last)
		if err != nil {
			return false, n, err
		}
		if len(recs) == 0 {
			if len(r.swept) > 0 {
				// The stream sends the swept rows' inserts again up to
				// here: it skips them (session.logical) until the
				// position passes it.
				var lsn string
				if err := r.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
					return false, n, fmt.Errorf("idem: cdc: read the WAL position: %w", err)
				}
				if r.sweptUntil, err = pglogrepl.ParseLSN(lsn); err != nil {
					return false, n, fmt.Errorf("idem: cdc: read the WAL position: %w", err)
				}
			}
			return true, n, nil
		}
		after = recs[len(recs)-1].Seq
		done, err := r.publishInOrder(ctx, recs)
		if err != nil {
			return false, n, err
		}
		if len(done) > 0 {
			if _, err := r.pool.Exec(ctx, del, done); err != nil {
				return false, n, fmt.Errorf("idem: cdc: delete the rows published at start: %w", err)
			}
			r.stats.deleted.Add(int64(len(done)))
			n += int64(len(done))
			r.remember(done)
		}
	}
}

// sweepPage reads up to sweepPage unpublished rows with a seq in (after,
// last], as text (the simple protocol), decoded like the stream's.
func (r *Relay) sweepPage(ctx context.Context, sel string, after, last int64) ([]driver.OutboxRecord, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	rows, err := r.pool.Query(qctx, sel, pgx.QueryExecModeSimpleProtocol, after, last)
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
			r.remember([]int64{rec.Seq})
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
			r.log.Warn("publishing the rows already in the outbox failed; retrying", "messages", len(round),
				"retry_in", delay.Round(time.Millisecond), "error", firstErr)
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

// remember records seqs as handled by the sweep: the stream skips their
// inserts.
func (r *Relay) remember(seqs []int64) {
	if r.swept == nil {
		r.swept = map[int64]struct{}{}
	}
	for _, seq := range seqs {
		r.swept[seq] = struct{}{}
	}
}

// errStopping ends a sweep at Stop.
var errStopping = errors.New("idem: cdc: stopping")

// stopping reports whether Stop was called.
func (r *Relay) stopping() bool {
	select {
	case <-r.base.Stopping():
		return true
	default:
		return false
	}
}
