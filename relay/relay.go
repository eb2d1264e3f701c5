package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/startstop"
)

const (
	releaseTimeout               = 5 * time.Second
	listenRetryMax               = 30 * time.Second
	markAttempts                 = 3
	unhealthyAfterFailedClaims   = 3
	pollJitter                   = 0.2
	defaultListenRetry           = time.Second
	maxBackoffShift              = 20
	stoppedHealthMessage         = "relay is not running"
	databaseFailingHealthMessage = "relay cannot claim from the database"
)

// ErrNotSupported is returned by New when the driver's dialect has no relay
// support (driver.RelayDialect).
var ErrNotSupported = errors.New("idem: relay: the database dialect does not support the polling relay")

// ErrAlreadyStarted is returned by Start on a relay that was started before.
var ErrAlreadyStarted = errors.New("idem: relay: already started")

// Relay publishes committed outbox rows to a broker. Create it with New,
// run it with Start, end it with Stop.
type Relay[TTx any] struct {
	drv     driver.Driver[TTx]
	dialect driver.RelayDialect
	claimer driver.OutboxClaimer // nil: claim with dialect in a transaction
	pub     broker.Publisher
	cfg     Config
	log     *slog.Logger

	wake chan struct{}
	// signals counts the wake-ups from outside (notifications, Notify),
	// so that a worker whose claim found nothing can tell whether one came
	// during the claim.
	signals atomic.Uint64
	// idle tells a driver.OutboxWaitListener that a claim found nothing.
	idle chan struct{}
	// lingering is held by the one worker that polls at
	// Config.BusyPollInterval after a round that found rows.
	lingering atomic.Bool

	// base is the lifecycle. claimCtx ends at Stop: no new claim; workCtx
	// ends when Stop runs out of time: in-flight publications are
	// cancelled.
	base        startstop.Base
	claimCtx    context.Context
	cancelClaim context.CancelFunc
	workCtx     context.Context
	cancelWork  context.CancelFunc

	// pauseUntil (unix nanoseconds) holds every worker back while the
	// broker fails whole calls; brokerFailures counts them in a row.
	pauseUntil     atomic.Int64
	brokerFailures atomic.Int64
	claimFailures  atomic.Int64

	stats   counters
	tracing tracing
	errs    limiters
}

// limiters log the failures of the relay's operations, once per cause and
// interval while they repeat, then a line when the operation succeeds
// again (package errlog).
type limiters struct {
	claim, publish, listen, mark, release, quarantine, retention, backlog *errlog.Limiter
}

func newLimiters(log *slog.Logger) limiters {
	l := func(what string) *errlog.Limiter { return errlog.New(log, what, errlog.Config{}) }
	return limiters{
		claim:      l("relay claims"),
		publish:    l("relay publications"),
		listen:     l("outbox notifications"),
		mark:       l("relay marks"),
		release:    l("relay releases"),
		quarantine: l("relay quarantine"),
		retention:  l("deletion of published rows"),
		backlog:    l("backlog measurement"),
	}
}

type counters struct {
	claims, claimed, published, publishErrors atomic.Int64
	takeovers, leasesLost, released, deleted  atomic.Int64
	quarantined                               atomic.Int64
	backlog, oldest, measuredAt, inQuarantine atomic.Int64
	inFlight                                  atomic.Int64
}

// Stats is a snapshot of a relay's counters since it was created, and of the
// backlog as last measured (every Config.StatsInterval).
type Stats struct {
	// Claims is the number of claims that returned rows; Claimed the rows
	// they returned.
	Claims, Claimed int64
	// Published is the number of rows confirmed by the broker and marked
	// published.
	Published int64
	// PublishErrors is the number of rows whose publication failed: the
	// broker refused them, or did not answer for them.
	PublishErrors int64
	// Quarantined is the number of rows this relay quarantined: rows that
	// cannot become messages, and rows the broker refused on
	// Config.QuarantineAfter attempts.
	Quarantined int64
	// Takeovers is the number of rows claimed from a worker whose lease had
	// expired.
	Takeovers int64
	// LeasesLost is the number of confirmed rows this relay did not mark
	// because its lease had ended first (taken over by another worker, or
	// expired: a mark is never sent after the lease); their next owner
	// publishes them again.
	LeasesLost int64
	// Released is the number of rows given back unpublished.
	Released int64
	// Deleted is the number of published rows deleted after Retention.
	Deleted int64
	// Backlog is the number of unpublished rows that are not quarantined
	// (rows waiting behind a quarantined row of their aggregate included),
	// and OldestUnpublished the insertion time of the oldest of them (zero
	// when none), as measured at BacklogMeasuredAt (zero before the first
	// measurement).
	Backlog           int64
	OldestUnpublished time.Time
	BacklogMeasuredAt time.Time
	// QuarantinedRows is the number of rows in quarantine in the outbox,
	// whichever relay put them there, as measured at BacklogMeasuredAt.
	QuarantinedRows int64
	// BrokerPausedUntil is set while the relay waits before trying a
	// failing broker again.
	BrokerPausedUntil time.Time
	// InFlight is the number of messages handed to the broker whose
	// Publish call has not returned yet.
	InFlight int64
}

// New returns a relay that publishes drv's outbox rows through pub.
func New[TTx any](drv driver.Driver[TTx], pub broker.Publisher, cfg Config) (*Relay[TTx], error) {
	if drv == nil || pub == nil {
		return nil, errors.New("idem: relay: New needs a driver and a publisher")
	}
	dialect, ok := drv.Dialect().(driver.RelayDialect)
	if !ok {
		return nil, fmt.Errorf("%w (%s)", ErrNotSupported, drv.Dialect().Name())
	}
	if _, listens := any(drv).(driver.OutboxListener); cfg.PollInterval == 0 && (!listens || cfg.DisableListen) {
		cfg.PollInterval = PollIntervalNoListenDefault
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	claimer, _ := any(drv).(driver.OutboxClaimer)
	log := cfg.Logger.With("component", "relay")
	// The contexts exist from the start, so that a Stop that runs out of
	// time while Start still checks the outbox has something to cancel.
	claimCtx, cancelClaim := context.WithCancel(context.Background())
	workCtx, cancelWork := context.WithCancel(context.Background())
	return &Relay[TTx]{
		claimCtx:    claimCtx,
		cancelClaim: cancelClaim,
		workCtx:     workCtx,
		cancelWork:  cancelWork,
		drv:         drv,
		dialect:     dialect,
		claimer:     claimer,
		pub:         pub,
		cfg:         cfg,
		log:         log,
		wake:        make(chan struct{}, 1),
		idle:        make(chan struct{}, 1),
		tracing:     newTracing(cfg, pub),
		errs:        newLimiters(log),
	}, nil
}

// Config returns the relay's configuration, with defaults.
func (r *Relay[TTx]) Config() Config { return r.cfg }

// Start checks that the outbox can be read, then starts the workers, the
// listener and the retention loop in the background. ctx bounds the check
// only: once Start has returned, the relay runs until Stop. Start returns an
// error when the relay was started (or stopped) before or the check fails.
func (r *Relay[TTx]) Start(ctx context.Context) error {
	if err := r.base.Starting(); err != nil {
		if errors.Is(err, startstop.ErrStarted) {
			return ErrAlreadyStarted
		}
		return err
	}
	if err := r.measureBacklog(ctx); err != nil {
		r.cancelClaim()
		r.cancelWork()
		r.base.StartFailed()
		return fmt.Errorf("idem: relay: read the outbox: %w", err)
	}

	var wg sync.WaitGroup
	for i := range r.cfg.Workers {
		wg.Go(func() { r.worker(i) })
	}
	l, listens := any(r.drv).(driver.OutboxListener)
	listens = listens && !r.cfg.DisableListen
	if listens {
		wg.Go(func() { r.listen(l) })
	}
	if r.cfg.Retention > 0 {
		wg.Go(r.retentionLoop)
	}
	if r.cfg.StatsInterval > 0 {
		wg.Go(r.statsLoop)
	}
	go func() {
		<-r.base.Stopping()
		r.cancelClaim()
	}()
	go func() {
		wg.Wait()
		r.cancelWork()
		r.base.Finished()
	}()
	if !r.base.Running() {
		return nil // stopped during the start-up: the workers are ending
	}
	r.log.Info("relay started", "workers", r.cfg.Workers, "batch_size", r.cfg.BatchSize,
		"lease", r.cfg.Lease, "listen", listens, "poll_interval", r.cfg.PollInterval,
		"quarantine_after", r.cfg.QuarantineAfter)
	if n := r.stats.inQuarantine.Load(); n > 0 {
		r.log.Warn("the outbox holds quarantined rows: they and the later rows of their aggregates are not published; "+
			"see \"idem failed list --relay\"", "rows", n)
	}
	return nil
}

// Stop stops claiming, lets in-flight batches finish (their rows are marked
// published or released) and returns when every goroutine has ended. If ctx
// ends first, in-flight publications are cancelled, their rows released,
// and Stop returns ctx's error once everything has ended. Stop is
// idempotent and safe to call from several goroutines; on a relay that was
// never started it only prevents a later start.
func (r *Relay[TTx]) Stop(ctx context.Context) error {
	return r.base.Stop(ctx, func() { r.log.Info("relay stopping") }, func() { r.cancelWork() })
}

// Done is closed when a started relay has stopped.
func (r *Relay[TTx]) Done() <-chan struct{} { return r.base.Done() }

// Stats returns a snapshot of the relay's counters.
func (r *Relay[TTx]) Stats() Stats {
	s := Stats{
		Claims:        r.stats.claims.Load(),
		Claimed:       r.stats.claimed.Load(),
		Published:     r.stats.published.Load(),
		PublishErrors: r.stats.publishErrors.Load(),
		Quarantined:   r.stats.quarantined.Load(),
		Takeovers:     r.stats.takeovers.Load(),
		LeasesLost:    r.stats.leasesLost.Load(),
		Released:      r.stats.released.Load(),
		Deleted:       r.stats.deleted.Load(),
		Backlog:       r.stats.backlog.Load(),
		InFlight:      r.stats.inFlight.Load(),

		QuarantinedRows: r.stats.inQuarantine.Load(),
	}
	if ns := r.stats.oldest.Load(); ns != 0 {
		s.OldestUnpublished = time.Unix(0, ns)
	}
	if ns := r.stats.measuredAt.Load(); ns != 0 {
		s.BacklogMeasuredAt = time.Unix(0, ns)
	}
	if ns := r.pauseUntil.Load(); ns > time.Now().UnixNano() {
		s.BrokerPausedUntil = time.Unix(0, ns)
	}
	return s
}

// Healthy returns nil while the relay runs and can claim from the database.
// A failing broker does not make it unhealthy: restarting the relay would
// not help; Stats().BrokerPausedUntil shows it.
func (r *Relay[TTx]) Healthy() error {
	if r.base.State() != startstop.Running {
		return errors.New(stoppedHealthMessage)
	}
	if r.claimFailures.Load() >= unhealthyAfterFailedClaims {
		return errors.New(databaseFailingHealthMessage)
	}
	return nil
}

// Notify wakes an idle worker to claim now, as a notification from the
// database would, and brings a backing-off relay (Config.MaxPollInterval)
// back to Config.PollInterval. Producers in the same process call it after
// committing outbox rows. A Notify that arrives while a worker is claiming
// is not lost: when that claim finds nothing, the worker claims again. It
// never blocks.
func (r *Relay[TTx]) Notify() { r.signal() }

// signal records a wake-up from outside (a notification, Notify) and wakes
// one idle worker.
func (r *Relay[TTx]) signal() {
	r.signals.Add(1)
	r.nudge()
}

// nudge wakes one idle worker.
func (r *Relay[TTx]) nudge() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
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

func (r *Relay[TTx]) worker(n int) {
	log := r.log.With("worker", n)
	ctx := r.claimCtx
	timer := time.NewTimer(0)
	defer timer.Stop()
	// slots bounds the batches this worker holds; inflight waits for
	// them when the worker ends.
	slots := make(chan struct{}, r.batchesPerWorker())
	var inflight sync.WaitGroup
	defer inflight.Wait()
	var failures int
	idle := r.cfg.PollInterval
	// held counts this worker's batches in flight; waiting is set while
	// it waits for a poll or a wake-up.
	var held atomic.Int32
	var waiting atomic.Bool
	// lingers: this worker holds r.lingering, polling at BusyPollInterval.
	lingers := false
	defer func() {
		if lingers {
			r.lingering.Store(false)
		}
	}()
	for {
		// Hold a free slot before waiting: a worker whose batches are all
		// in flight (a publish that hangs until its timeout) must leave
		// wake-ups to the workers that can claim, or a row notified then
		// would wait for that publish to end.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		reserved := true
		select {
		case <-ctx.Done():
			<-slots
			return
		case <-timer.C:
		case <-r.wake:
			idle = r.cfg.PollInterval
			if !ctxsleep.Sleep(ctx, r.cfg.Debounce) {
				<-slots
				return
			}
		}
		waiting.Store(false)
		found := false
		for ctx.Err() == nil {
			if d := time.Until(time.Unix(0, r.pauseUntil.Load())); d > 0 {
				if !ctxsleep.Sleep(ctx, d) {
					if reserved {
						<-slots
					}
					return
				}
			}
			if !reserved {
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
			reserved = false
			signals := r.signals.Load()
			b, err := r.claimBatch(log)
			if err != nil || b == nil {
				<-slots
			}
			if err != nil && ctx.Err() != nil {
				return // stopping: the claim was cancelled, nothing failed
			}
			if err != nil {
				failures++
				if r.claimFailures.Add(1) == unhealthyAfterFailedClaims {
					r.errs.claim.Error(ctx, "relay keeps failing to claim", err, "worker", n)
				} else {
					r.errs.claim.Warn(ctx, "claim failed", err, "worker", n)
				}
				if !ctxsleep.Sleep(ctx, backoff(r.cfg.RetryBackoff, r.cfg.MaxRetryBackoff, failures)) {
					return
				}
				continue
			}
			failures = 0
			r.claimFailures.Store(0)
			r.errs.claim.OK(ctx)
			if b == nil {
				if r.signals.Load() != signals {
					// Woken while claiming: the rows may have committed
					// after the claim's snapshot.
					found = true
					continue
				}
				break
			}
			found = true
			held.Add(1)
			inflight.Go(func() {
				r.process(log, b)
				left := held.Add(-1)
				<-slots
				switch {
				case b.more:
					// Its aggregates are free again: a claim that found
					// nothing while they were leased would now find rows.
					r.nudge()
				case left == 0 && waiting.Load() && !r.lingering.Load():
					r.declareIdle()
				}
			})
			if !b.moreHeads {
				// Every head there was is in this batch: another claim
				// would find nothing until it is marked (and then, if it
				// was full, its end wakes a worker).
				break
			}
			// More aggregates wait: claim the next batch while this one is
			// published, and let an idle worker help.
			r.nudge()
		}
		if found && r.cfg.BusyPollInterval > 0 {
			idle = r.cfg.PollInterval
			if !lingers && r.lingering.CompareAndSwap(false, true) {
				lingers = true
			}
			if lingers {
				// Rows came in this round: claim again shortly, without
				// waiting for a notification. A relay that keeps up with
				// a steady stream polls at this pace (one worker does),
				// and producers, whose inserts notify only while it
				// waits, do not notify at all.
				timer.Reset(r.cfg.BusyPollInterval)
				continue
			}
		}
		if lingers {
			lingers = false
			r.lingering.Store(false)
		}
		// About to wait: once this worker holds no batch, and unless
		// another worker polls at BusyPollInterval (it declares it when
		// its round finds nothing), a listener that makes the database
		// notify only while the relay waits declares it waiting, then
		// wakes it once more for the rows committed until then. A batch
		// still in flight declares it when it ends.
		waiting.Store(true)
		if held.Load() == 0 && !r.lingering.Load() {
			r.declareIdle()
		}
		switch {
		case found || r.cfg.MaxPollInterval == 0:
			idle = r.cfg.PollInterval
		default:
			idle = min(2*idle, r.cfg.MaxPollInterval)
		}
		timer.Reset(jitter(idle, pollJitter))
	}
}

// declareIdle tells a driver.OutboxWaitListener that the relay is about to
// wait.
func (r *Relay[TTx]) declareIdle() {
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
	if err != nil || len(rows) == 0 {
		return nil, err
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
	defer observeSince(r.cfg.ObserveClaim, start)
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

// item is one claimed row on its way to the broker.
type item struct {
	row       *driver.ClaimedRow
	msg       idem.Message
	published bool
	// err is why the row was not published. unreadable: the row cannot
	// become a message; fault: the broker did not answer for it (the whole
	// call failed, a timeout); neither: the broker refused it.
	err               error
	unreadable, fault bool
	confirmed         time.Time
}

// Publish calls per batch: a batch keeps up to publishCalls calls in flight,
// each carrying at least minCallSize messages when that many are ready.
const (
	publishCalls = 4
	minCallSize  = 64
)

// process publishes a claimed batch. The rows of one aggregate form a chain
// published one after the other: row k+1 goes to the broker only once row k
// was confirmed. Chains advance independently, in up to publishCalls
// concurrent Publish calls, each holding the next row of the aggregates
// that are ready. When a row fails, the later rows of its aggregate are not
// published. Then it marks what was confirmed, quarantines the rows that
// cannot be read or that the broker refused on their last allowed attempt,
// and releases the rest, all fenced by the batch's owner.
func (r *Relay[TTx]) process(log *slog.Logger, b *claimed) {
	owner, deadline, rows := b.owner, b.deadline, b.rows
	items := make([]item, len(rows))
	var chains [][]int
	chainOf := make(map[aggregateKey]int, len(rows))
	for i := range rows {
		items[i].row = &rows[i]
		k := aggregateKey{rows[i].AggregateType, rows[i].AggregateID}
		c, ok := chainOf[k]
		if !ok {
			c = len(chains)
			chainOf[k] = c
			chains = append(chains, nil)
		}
		chains[c] = append(chains[c], i)
	}
	// ready holds the chains whose next row can be published; next[c] is
	// the position of chain c's next row.
	ready := make([]int, len(chains))
	for c := range chains {
		ready[c] = c
	}
	next := make([]int, len(chains))

	type result struct {
		batch []int
		msgs  []idem.Message
		err   error
		at    time.Time
	}
	results := make(chan result, publishCalls)
	var inFlight, calls int
	// faultDelay is how long rows the broker did not answer for wait;
	// paused says that brokerFailed recorded why; halted that no more calls
	// start.
	faultDelay := backoff(r.cfg.RetryBackoff, r.cfg.MaxRetryBackoff, 1)
	paused, halted := false, false
	for {
		for !halted && len(ready) > 0 && inFlight < publishCalls {
			if calls > 0 && r.claimCtx.Err() != nil {
				halted = true // Stopping: release what is left.
				break
			}
			if time.Until(deadline) < r.cfg.PublishTimeout+r.cfg.leaseMargin() {
				log.Warn("lease about to expire; releasing the rest of the batch", "aggregates_left", len(ready)+inFlight)
				halted = true
				break
			}
			size := max(minCallSize, (len(ready)+publishCalls-inFlight-1)/(publishCalls-inFlight))
			take := ready[:min(size, len(ready))]
			var batch []int
			var msgs []idem.Message
			for _, c := range take {
				i := chains[c][next[c]]
				it := &items[i]
				msg, err := toMessage(it.row.OutboxRecord)
				if err != nil {
					// Retrying cannot fix the row: quarantine it at once;
					// the rest of its chain waits.
					it.err, it.unreadable = err, true
					continue
				}
				it.msg = msg
				batch = append(batch, i)
				msgs = append(msgs, msg)
			}
			ready = ready[len(take):]
			if len(msgs) == 0 {
				continue
			}
			calls++
			inFlight++
			go func() {
				ctx, cancel := context.WithTimeout(r.workCtx, r.cfg.PublishTimeout)
				spans := r.tracing.startSpans(ctx, items, batch, msgs)
				err := r.publish(ctx, msgs)
				cancel()
				endSpans(spans, err)
				results <- result{batch: batch, msgs: msgs, err: err, at: time.Now()}
			}()
		}
		if inFlight == 0 {
			break
		}
		res := <-results
		inFlight--
		var batchErr *broker.BatchError
		whole := res.err != nil && !errors.As(res.err, &batchErr)
		var accepted, faults int
		var firstFault error
		for j, e := range broker.Results(res.err, len(res.msgs)) {
			i := res.batch[j]
			it := &items[i]
			if e == nil {
				it.published, it.confirmed = true, res.at
				accepted++
				c := chainOf[aggregateKey{it.row.AggregateType, it.row.AggregateID}]
				if next[c]++; next[c] < len(chains[c]) {
					ready = append(ready, c)
				}
				continue
			}
			it.err = e
			it.fault = whole || broker.IsFault(e)
			if it.fault {
				faults++
				firstFault = cmp.Or(firstFault, e)
			}
		}
		if whole || (accepted == 0 && faults == len(res.msgs)) {
			// The broker is away: pause every worker, and count no attempt.
			if !paused {
				faultDelay, paused = r.brokerFailed(cmp.Or(res.err, firstFault)), true
			}
			halted = true
			continue
		}
		r.brokerFailures.Store(0)
		if faults == 0 {
			r.errs.publish.OK(r.workCtx)
		}
	}

	var seqs []int64
	for i := range items {
		if items[i].published {
			seqs = append(seqs, items[i].row.Seq)
		}
	}
	if len(seqs) > 0 {
		if fault.Enabled {
			fault.Point(fault.RelayAfterPublishBeforeMark)
		}
		marked, err := r.mark(owner, deadline, seqs)
		if errors.Is(err, errLeaseExpired) {
			r.stats.leasesLost.Add(int64(len(seqs)))
			log.Warn("lease expired before the mark: the rows will be published again by their next owner", "rows", len(seqs))
		} else if err != nil {
			r.errs.mark.Error(r.workCtx, "mark published failed; the rows will be published again after the lease", err, "rows", len(seqs))
		} else {
			r.errs.mark.OK(r.workCtx)
			r.stats.published.Add(marked)
			if lost := int64(len(seqs)) - marked; lost > 0 {
				r.stats.leasesLost.Add(lost)
				log.Warn("lease lost: rows were taken over by another worker, which publishes them again", "rows", lost)
			}
			if r.cfg.ObserveDelay != nil && marked == int64(len(seqs)) {
				for i := range items {
					if items[i].published && !items[i].row.CreatedAt.IsZero() {
						r.cfg.ObserveDelay(items[i].confirmed.Sub(items[i].row.CreatedAt))
					}
				}
			}
		}
		if fault.Enabled {
			fault.Point(fault.RelayAfterMark)
		}
	}

	var (
		release              []driver.ReleaseRow
		quarantine           []driver.QuarantineRow
		refused, faultCount  int64
		firstRefused, anyErr error
	)
	for i := range items {
		it := &items[i]
		switch {
		case it.published:
		case it.err == nil || errors.Is(it.err, context.Canceled):
			// Not attempted, or stopped in flight.
			release = append(release, driver.ReleaseRow{Seq: it.row.Seq})
		case it.unreadable:
			quarantine = append(quarantine, driver.QuarantineRow{Seq: it.row.Seq, Error: it.err.Error()})
		case it.fault:
			faultCount++
			anyErr = cmp.Or(anyErr, it.err)
			release = append(release, driver.ReleaseRow{Seq: it.row.Seq, Error: it.err.Error(), Delay: faultDelay})
		default:
			refused++
			firstRefused = cmp.Or(firstRefused, it.err)
			attempts := it.row.Attempts + 1
			if r.cfg.QuarantineAfter > 0 && attempts >= r.cfg.QuarantineAfter {
				quarantine = append(quarantine, driver.QuarantineRow{Seq: it.row.Seq,
					Error: fmt.Sprintf("refused by the broker on %d attempts; last: %v", attempts, it.err)})
				continue
			}
			release = append(release, driver.ReleaseRow{Seq: it.row.Seq, Error: it.err.Error(),
				Delay: backoff(r.cfg.RetryBackoff, r.cfg.MaxRetryBackoff, attempts), Refused: true})
		}
	}
	if n := refused + faultCount; n > 0 {
		r.stats.publishErrors.Add(n)
	}
	if refused > 0 {
		log.Warn("the broker refused rows; they will be retried, and quarantined after Config.QuarantineAfter attempts",
			"rows", refused, "error", firstRefused)
	}
	if faultCount > 0 && !paused && !errors.Is(anyErr, context.Canceled) {
		r.errs.publish.Warn(r.workCtx, "the broker did not confirm rows; they will be retried", anyErr, "rows", faultCount)
	}
	if len(quarantine) > 0 {
		r.quarantine(log, owner, items, quarantine)
	}
	if len(release) > 0 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.workCtx), releaseTimeout)
		n, err := r.dialect.ReleaseOutbox(ctx, r.drv.Pool(), owner, release)
		cancel()
		if err != nil {
			r.errs.release.Error(r.workCtx, "release failed; the rows wait for their lease to expire", err, "rows", len(release))
		} else {
			r.errs.release.OK(r.workCtx)
			r.stats.released.Add(n)
		}
	}
}

// quarantine sets rows aside and logs each of them.
func (r *Relay[TTx]) quarantine(log *slog.Logger, owner uuid.UUID, items []item, rows []driver.QuarantineRow) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.workCtx), releaseTimeout)
	done, err := r.dialect.QuarantineOutbox(ctx, r.drv.Pool(), owner, rows)
	cancel()
	if err != nil {
		r.errs.quarantine.Error(r.workCtx, "quarantine failed; the rows are tried again after their lease", err, "rows", len(rows))
		return
	}
	r.errs.quarantine.OK(r.workCtx)
	r.stats.quarantined.Add(int64(len(done)))
	if lost := len(rows) - len(done); lost > 0 {
		r.stats.leasesLost.Add(int64(lost))
		log.Warn("lease lost: rows to quarantine were taken over by another worker", "rows", lost)
	}
	reasons := make(map[int64]string, len(rows))
	for _, q := range rows {
		reasons[q.Seq] = q.Error
	}
	bySeq := make(map[int64]*driver.ClaimedRow, len(done))
	for i := range items {
		bySeq[items[i].row.Seq] = items[i].row
	}
	for _, seq := range done {
		row := bySeq[seq]
		log.Error("outbox row quarantined: it is not published, and the later rows of its aggregate wait behind it; "+
			"see \"idem failed show --relay\", then retry or remove it",
			"seq", seq, "id", row.RawID, "aggregate_type", row.AggregateType, "aggregate_id", row.AggregateID,
			"event", row.Type, "attempts", row.Attempts+1, "error", reasons[seq])
	}
}

// errLeaseExpired is why a mark is not sent once its lease has ended.
var errLeaseExpired = errors.New("the lease expired before the mark")

// mark marks the rows of seqs published, retrying while the lease lasts. It
// sends no mark once deadline, the lease's end as measured from before the
// claim, has passed: the rows may be another owner's by then.
func (r *Relay[TTx]) mark(owner uuid.UUID, deadline time.Time, seqs []int64) (int64, error) {
	defer observeSince(r.cfg.ObserveMark, time.Now())
	var err error
	for attempt := 1; ; attempt++ {
		if !time.Now().Before(deadline) {
			return 0, cmp.Or(err, errLeaseExpired)
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.workCtx), min(r.cfg.QueryTimeout, time.Until(deadline)))
		var n int64
		n, err = r.dialect.MarkPublished(ctx, r.drv.Pool(), owner, seqs)
		cancel()
		if err == nil {
			return n, nil
		}
		if attempt == markAttempts || time.Until(deadline) < r.cfg.leaseMargin() || r.workCtx.Err() != nil {
			return 0, err
		}
		if !ctxsleep.Sleep(r.workCtx, backoff(10*time.Millisecond, time.Second, attempt)) {
			return 0, err
		}
	}
}

// brokerFailed pauses every worker after a whole Publish call failed, and
// returns the pause.
func (r *Relay[TTx]) brokerFailed(err error) time.Duration {
	n := r.brokerFailures.Add(1)
	d := backoff(r.cfg.RetryBackoff, r.cfg.MaxRetryBackoff, int(n))
	until := time.Now().Add(d).UnixNano()
	for {
		cur := r.pauseUntil.Load()
		if cur >= until || r.pauseUntil.CompareAndSwap(cur, until) {
			break
		}
	}
	if !errors.Is(err, context.Canceled) {
		r.errs.publish.Warn(r.workCtx, "broker failed; pausing", err, "pause", d.Round(time.Millisecond), "failures_in_a_row", n)
	}
	return d
}

// columns names the outbox columns behind the envelope's fields, for the
// errors of rows that cannot become messages.
var columns = map[string]string{
	"event_id":          "id",
	"event_name":        "type (the event name)",
	"aggregate_type":    "aggregatetype",
	"aggregate_id":      "aggregateid",
	"aggregate_version": "aggregate_version",
	"payload":           "payload",
}

// toMessage returns the message of a row, or an error (a
// *driver.UnreadableError) when the row cannot become one.
func toMessage(rec driver.OutboxRecord) (idem.Message, error) {
	if rec.Unreadable != nil {
		return idem.Message{}, rec.Unreadable
	}
	msg, err := idem.NewMessage(idem.Event{
		ID:               rec.ID,
		Name:             rec.Type,
		OccurredAt:       rec.OccurredAt,
		AggregateType:    rec.AggregateType,
		AggregateID:      rec.AggregateID,
		AggregateVersion: rec.AggregateVersion,
		Payload:          rec.Payload,
		Headers:          rec.Headers,
	})
	if err != nil {
		var fe *idem.FieldError
		if errors.As(err, &fe) {
			err = fmt.Errorf("%s %s", cmp.Or(columns[fe.Field], fe.Field), fe.Problem)
		}
		return idem.Message{}, &driver.UnreadableError{Seq: rec.Seq, Problems: []error{err}}
	}
	return msg, nil
}

func (r *Relay[TTx]) listen(l driver.OutboxListener) {
	ctx := r.claimCtx
	var failures int
	for {
		var connected atomic.Bool // notify runs on the listener's goroutines
		notify := func() {
			if !connected.Load() && !connected.Swap(true) {
				r.errs.listen.OK(ctx)
			}
			r.signal()
		}
		var err error
		if wl, ok := l.(driver.OutboxWaitListener); ok {
			err = wl.ListenOutboxWaiting(ctx, notify, r.idle)
		} else {
			err = l.ListenOutbox(ctx, notify)
		}
		if ctx.Err() != nil {
			return
		}
		if connected.Load() {
			failures = 0
		}
		failures++
		d := backoff(defaultListenRetry, listenRetryMax, failures)
		r.errs.listen.Warn(ctx, "listen for outbox notifications failed; polling until it reconnects", err, "retry_in", d.Round(time.Millisecond))
		if !ctxsleep.Sleep(ctx, d) {
			return
		}
	}
}

func (r *Relay[TTx]) retentionLoop() {
	ctx := r.claimCtx
	for {
		if !ctxsleep.Sleep(ctx, jitter(r.cfg.RetentionInterval, pollJitter)) {
			return
		}
		before := time.Now().Add(-r.cfg.Retention)
		for ctx.Err() == nil {
			qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
			n, err := r.dialect.DeletePublished(qctx, r.drv.Pool(), before, r.cfg.DeleteBatchSize)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					r.errs.retention.Warn(ctx, "delete published rows failed", err)
				}
				break
			}
			r.errs.retention.OK(ctx)
			r.stats.deleted.Add(n)
			if n < int64(r.cfg.DeleteBatchSize) {
				break
			}
		}
	}
}

func (r *Relay[TTx]) statsLoop() {
	ctx := r.claimCtx
	for ctxsleep.Sleep(ctx, r.cfg.StatsInterval) {
		switch err := r.measureBacklog(ctx); {
		case err == nil:
			r.errs.backlog.OK(ctx)
		case ctx.Err() == nil:
			r.errs.backlog.Warn(ctx, "measure backlog failed", err)
		}
	}
}

func (r *Relay[TTx]) measureBacklog(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	b, err := r.dialect.OutboxBacklog(ctx, r.drv.Pool())
	if err != nil {
		return err
	}
	r.stats.backlog.Store(b.Rows)
	r.stats.inQuarantine.Store(b.Quarantined)
	var oldest int64
	if !b.Oldest.IsZero() {
		oldest = b.Oldest.UnixNano()
	}
	r.stats.oldest.Store(oldest)
	r.stats.measuredAt.Store(time.Now().UnixNano())
	return nil
}

// jitter returns d changed by a random fraction in [-f, +f].
func jitter(d time.Duration, f float64) time.Duration {
	return time.Duration(float64(d) * (1 + f*(2*rand.Float64()-1)))
}

// backoff returns base doubled attempt-1 times, capped at max, with "equal
// jitter": between half of it and all of it.
func backoff(base, max time.Duration, attempt int) time.Duration {
	shift := min(max0(attempt-1), maxBackoffShift)
	d := base << shift
	if d > max || d <= 0 {
		d = max
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}

func max0(n int) int {
	if n < 0 {
		return 0
	}
	return n
}
