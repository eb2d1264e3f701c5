package relay

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/fault"
)

// The claim loop: each worker claims batches of rows and hands them to
// process (publish.go), which publishes them and settles them (settle.go).
//
// Wake-up rules:
//   - A worker waits for its poll timer or a wake-up (a notification from
//     the database, Notify, or another worker's nudge), then claims until a
//     claim finds nothing.
//   - A claim that finds nothing while a wake-up came during it claims again:
//     the rows may have committed after the claim's snapshot; unless another
//     claim started since. A woken worker does not claim either when a
//     claim started after every wake-up so far: it sees their rows.
//   - A batch that held every aggregate waiting (no more heads) ends the
//     round: another claim would find nothing until it is marked. A full
//     batch, or an aggregate with as many rows as a claim takes, nudges a
//     worker when its batch ends: its aggregates are free again.
//   - After a round that found rows, one worker at a time lingers: it polls
//     at Config.BusyPollInterval, so that a steady stream is read without
//     notifications (producers notify only while the relay waits).
//   - A worker about to wait with no batch in flight, while no worker
//     lingers, declares the relay idle to a driver.OutboxWaitListener,
//     which then makes the database notify again; a poll that found
//     nothing declares it only if a wake-up, a nudge or a batch's end came
//     since the last declaration (declareIdle).
//   - A worker about to wait longer than Config.PollInterval waits no
//     longer than until the next delayed row falls due (untilNextDue).
//   - Without rows, the poll interval doubles up to Config.MaxPollInterval;
//     a poll (not a wake-up) that finds rows brings it back to
//     Config.PollInterval: someone writes rows without notifying. Wake-ups
//     leave it alone: rows that are announced need no poll, and a relay
//     woken ten times a second that went back to polling every
//     PollInterval after each would claim for nothing between them.

// pacer is a worker's poll interval: how long it waits before claiming
// again, after a round that found rows or not.
type pacer struct {
	poll, busy, max time.Duration // Config.PollInterval, BusyPollInterval, MaxPollInterval
	idle            time.Duration // the current interval without rows
}

func newPacer(cfg Config) pacer {
	return pacer{poll: cfg.PollInterval, busy: cfg.BusyPollInterval, max: cfg.MaxPollInterval, idle: cfg.PollInterval}
}

// mayLinger reports whether a round that found rows lets the worker poll at
// the busy pace (if it gets the relay's one lingering place).
func (p *pacer) mayLinger(found bool) bool { return found && p.busy > 0 }

// next returns the wait before the next claim (before jitter) after a
// round: found says it claimed rows, woken that a wake-up (not the timer)
// started it, lingers that the worker holds the lingering place.
func (p *pacer) next(found, woken, lingers bool) time.Duration {
	switch {
	case lingers:
		p.idle = p.poll
		return p.busy
	case p.max == 0 || found && !woken:
		p.idle = p.poll
	case !found:
		p.idle = min(2*p.idle, p.max)
	}
	return p.idle
}

// batchesPerWorker returns how many claimed batches a worker holds at
// once. With a driver.OutboxClaimer (a claim in one round trip, on a pool of
// connections) two: one being published while the next is claimed. Claims
// in a transaction of their own (database/sql drivers; SQLite's one
// connection) would make marks wait behind claims, and a mark that waits
// past the lease is lost: one.
func (r *Relay[TTx]) batchesPerWorker() int {
	if r.claimer != nil {
		return 2
	}
	return 1
}

// worker is one claim loop; it returns when the relay stops claiming, once
// its batches have been settled.
func (r *Relay[TTx]) worker(n int) {
	w := &worker[TTx]{
		r:     r,
		n:     n,
		log:   r.log.With("worker", n),
		ctx:   r.claimCtx,
		slots: make(chan struct{}, r.batchesPerWorker()),
		pace:  newPacer(r.cfg),
		retry: backoff.Backoff{Base: r.cfg.RetryBackoff, Max: r.cfg.MaxRetryBackoff},
	}
	w.run()
}

// worker is the state of one claim loop.
type worker[TTx any] struct {
	r   *Relay[TTx]
	n   int
	log *slog.Logger
	ctx context.Context // ends at Stop: no new claim

	// slots bounds the batches the worker holds; inflight waits for them
	// when it ends; held counts them.
	slots    chan struct{}
	inflight sync.WaitGroup
	held     atomic.Int32
	// waiting is set while the worker waits for its timer or a wake-up.
	waiting atomic.Bool
	// lingers: the worker holds the relay's lingering place.
	lingers bool
	pace    pacer
	retry   backoff.Backoff // claim failures in a row
}

func (w *worker[TTx]) run() {
	r := w.r
	timer := time.NewTimer(0)
	defer timer.Stop()
	defer w.inflight.Wait()
	defer w.setLingering(false)
	for {
		// Hold a free slot before waiting: a worker whose batches are all
		// in flight (a publish that hangs until its timeout) must leave
		// wake-ups to the workers that can claim, or a row notified then
		// would wait for that publish to end.
		if !w.acquire() {
			return
		}
		woken := false
		select {
		case <-w.ctx.Done():
			w.release()
			return
		case <-timer.C:
		case <-r.wake:
			woken = true
			if !ctxsleep.Sleep(w.ctx, r.cfg.Debounce) {
				w.release()
				return
			}
			if !r.nudged.Swap(false) && r.answered() {
				// Another worker's claim started after every wake-up so
				// far: it sees their rows.
				w.release()
				continue
			}
		}
		w.waiting.Store(false)
		found, ok := w.round()
		if !ok {
			return
		}
		w.setLingering(w.pace.mayLinger(found) && (w.lingers || r.lingering.CompareAndSwap(false, true)))
		if !w.lingers {
			// About to wait: once this worker holds no batch, and unless
			// another worker lingers (it declares it when its round finds
			// nothing), declare the relay idle. A batch still in flight
			// declares it when it ends.
			w.waiting.Store(true)
			if w.held.Load() == 0 && !r.lingering.Load() {
				r.declareIdle(!found)
			}
		}
		base := w.pace.next(found, woken, w.lingers)
		d := base
		if !w.lingers {
			d = backoff.Jitter(d, pollJitter)
		}
		if base > r.cfg.PollInterval {
			// Backing off (MaxPollInterval): one index probe per wait, so
			// that a delayed row is not left until the next poll.
			d = r.untilNextDue(d)
		}
		timer.Reset(d)
	}
}

// untilNextDue returns d, or less when a delayed row falls due before d
// has passed: a relay whose poll interval grew (MaxPollInterval) still
// claims a delayed row at its time. A failed read leaves d.
func (r *Relay[TTx]) untilNextDue(d time.Duration) time.Duration {
	ctx, cancel := context.WithTimeout(r.claimCtx, r.cfg.QueryTimeout)
	defer cancel()
	next, err := r.dialect.NextDue(ctx, r.drv.Pool())
	if err != nil || next.IsZero() {
		return d
	}
	return max(min(d, next.Sub(r.cfg.now())), 0)
}

// setLingering takes or gives back the relay's lingering place.
func (w *worker[TTx]) setLingering(on bool) {
	if w.lingers && !on {
		w.r.lingering.Store(false)
	}
	w.lingers = on
}

// acquire takes a slot, or reports false when the relay stops first.
func (w *worker[TTx]) acquire() bool {
	select {
	case w.slots <- struct{}{}:
		return true
	case <-w.ctx.Done():
		return false
	}
}

func (w *worker[TTx]) release() { <-w.slots }

// round claims batches, holding a slot for each, until a claim finds
// nothing or every aggregate waiting is claimed. It is entered holding a
// slot. It reports whether it found rows, and false when the relay stops.
func (w *worker[TTx]) round() (found, ok bool) {
	r := w.r
	reserved := true // the slot taken before the wait
	for w.ctx.Err() == nil {
		if d := time.Until(time.Unix(0, r.pauseUntil.Load())); d > 0 {
			if !ctxsleep.Sleep(w.ctx, d) {
				if reserved {
					w.release()
				}
				return found, false
			}
		}
		if !r.waitUnpaused(w.ctx) {
			if reserved {
				w.release()
			}
			return found, false
		}
		if !reserved && !w.acquire() {
			return found, false
		}
		reserved = false
		r.coverSignals()
		b, err := r.claimBatch(w.log)
		if err != nil || b == nil {
			w.release()
		}
		if err != nil {
			if w.ctx.Err() != nil {
				return found, false // stopping: the claim was cancelled, nothing failed
			}
			if r.claimFailures.Add(1) == unhealthyAfterFailedClaims {
				r.errs.claim.Error(w.ctx, "relay keeps failing to claim", err, "worker", w.n)
			} else {
				r.errs.claim.Warn(w.ctx, "claim failed", err, "worker", w.n)
			}
			if !ctxsleep.Sleep(w.ctx, w.retry.Next()) {
				return found, false
			}
			continue
		}
		w.retry.Reset()
		r.claimFailures.Store(0)
		r.errs.claim.OK(w.ctx)
		if b == nil {
			if !r.answered() {
				// Woken while claiming, and no claim started since: the
				// rows may have committed after the claim's snapshot.
				found = true
				continue
			}
			return found, true
		}
		found = true
		w.held.Add(1)
		w.inflight.Go(func() {
			r.process(w.log, b)
			left := w.held.Add(-1)
			w.release()
			switch {
			case b.more:
				// Its aggregates are free again: a claim that found
				// nothing while they were leased would now find rows.
				r.nudge()
			case left == 0 && w.waiting.Load() && !r.lingering.Load():
				r.declareIdle(false)
			}
		})
		if !b.moreHeads {
			// Every head there was is in this batch: another claim would
			// find nothing until it is marked (and then, if it was full,
			// its end wakes a worker).
			return found, true
		}
		// More aggregates wait: claim the next batch while this one is
		// published, and let an idle worker help.
		r.nudge()
	}
	return found, false
}

// coverSignals records, as a claim starts, that the wake-ups so far are
// answered.
func (r *Relay[TTx]) coverSignals() {
	n := r.signals.Load()
	for {
		c := r.covered.Load()
		if c >= n || r.covered.CompareAndSwap(c, n) {
			return
		}
	}
}

// answered reports whether a claim started after every wake-up so far. A
// wake-up that another worker's claim answered needs no claim of its own:
// notifications that arrive together (a commit's, and the listener's after
// the batch before it) cost one claim, not one each.
func (r *Relay[TTx]) answered() bool { return r.covered.Load() >= r.signals.Load() }

// declareIdle tells a driver.OutboxWaitListener that the relay is about to
// wait; the listener then looks whether a claim could find rows. After a
// round whose claims found nothing (emptyRound), it does not when it
// already did and nothing happened since that the listener's last look
// would miss: no wake-up (a notification releases the listener's lock and
// wakes a worker: signal clears r.declared), no nudge, no batch ended
// (which always declares). The round's own claims just looked; an idle
// relay that polls thus costs one claim per poll, not a claim and a check.
func (r *Relay[TTx]) declareIdle(emptyRound bool) {
	if emptyRound && r.declared.Load() {
		return
	}
	r.declared.Store(true)
	select {
	case r.idle <- struct{}{}:
	default:
	}
}

// claimed is a batch on its way to the broker.
type claimed struct {
	owner    uuid.UUID
	deadline time.Time
	rows     []driver.ClaimedRow
	// more says that more rows are probably waiting: the batch was full,
	// or an aggregate had as many rows as a claim takes. moreHeads says
	// that more aggregates probably wait: the claim took as many as it may.
	more, moreHeads bool
}

// claimBatch claims one batch, or returns nil when there is nothing to
// claim.
func (r *Relay[TTx]) claimBatch(log *slog.Logger) (*claimed, error) {
	owner := uuid.New()
	params := r.cfg.ClaimParams(owner)
	rows, start, err := r.claim(params)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		r.stats.emptyClaims.Add(1)
		return nil, nil
	}
	if fault.Enabled {
		fault.Point(fault.RelayAfterClaim)
	}
	r.stats.claims.Add(1)
	r.stats.claimed.Add(int64(len(rows)))
	var taken int64
	per := make(map[aggregateKey]int, len(rows))
	longest := 0
	for _, row := range rows {
		if row.TakenOver {
			taken++
		}
		k := aggregateKey{row.AggregateType, row.AggregateID}
		per[k]++
		longest = max(longest, per[k])
	}
	if taken > 0 {
		r.stats.takeovers.Add(taken)
		log.Warn("took over expired leases", "rows", taken)
	}
	return &claimed{owner: owner, deadline: start.Add(r.cfg.Lease), rows: rows,
		more:      len(rows) == r.cfg.BatchSize || longest == r.cfg.MaxPerAggregate,
		moreHeads: len(per) >= params.HeadLimit()}, nil
}

// claim claims a batch. It returns when the lease started at the latest:
// before the call with a driver.OutboxClaimer, else once the claim's
// transaction holds its connection (waiting for a connection of a busy
// pool must not eat the lease).
func (r *Relay[TTx]) claim(params driver.ClaimParams) (rows []driver.ClaimedRow, start time.Time, err error) {
	start = time.Now()
	defer observeSince(r.cfg.Observer.Claim, start)
	ctx, cancel := context.WithTimeout(r.claimCtx, r.cfg.QueryTimeout)
	defer cancel()
	if r.claimer != nil {
		rows, err = r.claimer.ClaimOutbox(ctx, params)
		return rows, start, err
	}
	tx, err := r.drv.Begin(ctx)
	if err != nil {
		return nil, start, err
	}
	start = time.Now()
	defer func() {
		if err != nil {
			_ = r.drv.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	rows, err = r.dialect.ClaimOutbox(ctx, r.drv.Tx(tx), params)
	if err != nil {
		return nil, start, err
	}
	if err := r.drv.Commit(ctx, tx); err != nil {
		return nil, start, err
	}
	return rows, start, nil
}

type aggregateKey struct{ typ, id string }
