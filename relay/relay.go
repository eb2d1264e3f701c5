package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/pausewatch"
	"github.com/idem-go/idem/internal/startstop"
	"github.com/idem-go/idem/relay/internal/sendspan"
)

const (
	releaseTimeout               = 5 * time.Second
	listenRetryMax               = 30 * time.Second
	markAttempts                 = 3
	unhealthyAfterFailedClaims   = 3
	pollJitter                   = 0.2
	defaultListenRetry           = time.Second
	stoppedHealthMessage         = "relay is not running"
	databaseFailingHealthMessage = "relay cannot claim from the database"
)

// ErrAlreadyStarted is returned by Start on a relay that was started before.
// It is idem.ErrStarted, which every service returns.
var ErrAlreadyStarted = idem.ErrStarted

// Relay publishes committed outbox rows to a broker. Create it with New,
// run it with Start, end it with Stop.
type Relay[TTx any] struct {
	drv     driver.Driver[TTx]
	dialect driver.Dialect
	claimer driver.OutboxClaimer // nil: claim with dialect in a transaction
	pub     broker.Publisher
	cfg     Config
	log     *slog.Logger

	wake chan struct{}
	// signals counts the wake-ups from outside (notifications, Notify),
	// so that a worker whose claim found nothing can tell whether one came
	// during the claim.
	signals atomic.Uint64
	// covered is the value signals had when the latest claim started: the
	// wake-ups up to it are answered, since a claim sees every row
	// committed before it starts.
	covered atomic.Uint64
	// nudged is set by nudge: the next woken worker claims even if the
	// wake-ups are answered.
	nudged atomic.Bool
	// idle tells a driver.OutboxWaitListener that a claim found nothing;
	// declared says that it was told and nothing happened since
	// (declareIdle).
	idle     chan struct{}
	declared atomic.Bool
	// lingering is held by the one worker that polls at
	// Config.BusyPollInterval after a round that found rows.
	lingering atomic.Bool

	// base is the lifecycle. claimCtx (its StopContext) ends at Stop: no
	// new claim; workCtx (its WorkContext) ends when Stop runs out of time:
	// in-flight publications are cancelled.
	base     startstop.Base
	claimCtx context.Context
	workCtx  context.Context

	// pauseUntil (unix nanoseconds) holds every worker back while the
	// broker fails whole calls; brokerFailures counts them in a row.
	pauseUntil     atomic.Int64
	brokerFailures atomic.Int64
	claimFailures  atomic.Int64

	// pauses is the operator's pause of the relay's outbox; nil when the
	// relay cannot read it (Start says so). Stats and Healthy read it
	// while Start may clear it.
	pauses atomic.Pointer[pausewatch.Watch]

	stats   counters
	tracing sendspan.Tracer
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
	scheduled                                 atomic.Int64
	inFlight                                  atomic.Int64
	pausedRounds                              atomic.Int64
	emptyClaims                               atomic.Int64
}

// Stats is a snapshot of a relay's counters since it was created, and of the
// backlog as last measured (every Config.StatsInterval).
type Stats struct {
	// Claims is the number of claims that returned rows; Claimed the rows
	// they returned; EmptyClaims the number of claims that found nothing.
	Claims, Claimed, EmptyClaims int64
	// Wakeups is the number of wake-ups from outside: notifications from
	// the database (and the listener's own, when it starts and when the
	// relay's wait lock is taken) and calls to Notify.
	Wakeups int64
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
	// Scheduled is the number of delayed rows (idem.Event.NotBefore) not
	// due yet, as measured at BacklogMeasuredAt; Backlog leaves them out.
	Scheduled int64
	// QuarantinedRows is the number of rows in quarantine in the outbox,
	// whichever relay put them there, as measured at BacklogMeasuredAt.
	QuarantinedRows int64
	// BrokerPausedUntil is set while the relay waits before trying a
	// failing broker again.
	BrokerPausedUntil time.Time
	// Paused is the operator's pause holding the relay (PauseStore), as
	// last read; nil when none holds it. PausedRounds counts the claim
	// rounds its workers held back for a pause, once per PauseCheck.
	Paused       *idem.Pause
	PausedRounds int64
	// InFlight is the number of messages handed to the broker whose
	// Publish call has not returned yet.
	InFlight int64
}

// New returns a relay that publishes drv's outbox rows through pub.
func New[TTx any](drv driver.Driver[TTx], pub broker.Publisher, cfg Config) (*Relay[TTx], error) {
	if drv == nil || pub == nil {
		return nil, errors.New("idem: relay: New needs a driver and a publisher")
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
	r := &Relay[TTx]{
		drv:     drv,
		dialect: drv.Dialect(),
		claimer: claimer,
		pub:     pub,
		cfg:     cfg,
		log:     log,
		wake:    make(chan struct{}, 1),
		idle:    make(chan struct{}, 1),
		tracing: newTracing(cfg, pub),
		errs:    newLimiters(log),
	}
	r.claimCtx, r.workCtx = r.base.StopContext(), r.base.WorkContext()
	r.pauses.Store(pausewatch.New(idem.PauseRelay, drv.Dialect().Tables().Outbox, drv.Dialect(), drv.Pool(), PauseCheck, cfg.now, log))
	return r, nil
}

// Config returns the relay's configuration, with defaults.
func (r *Relay[TTx]) Config() Config { return r.cfg }

// Start checks that the outbox can be read, then starts the workers, the
// listener and the retention loop in the background. ctx bounds the check
// only: once Start has returned, the relay runs until Stop. Start returns an
// error when the relay was started (or stopped) before or the check fails.
func (r *Relay[TTx]) Start(ctx context.Context) error {
	if err := r.base.Starting(); err != nil {
		return err
	}
	// A Stop during the check ends it.
	checkCtx, cancel := r.base.StartContext(ctx)
	err := r.measureBacklog(checkCtx)
	if err == nil {
		if _, perr := r.dialect.ListPauses(checkCtx, r.drv.Pool(), idem.PauseRelay, r.dialect.Tables().Outbox); perr != nil && checkCtx.Err() == nil {
			r.log.Warn("cannot read the table of operators' pauses: this relay cannot be paused (idem pause --relay) until idem migrate adds it (migration 0015) or its role may read it",
				"error", perr)
			r.pauses.Store(nil)
		}
	}
	cancel()
	if err != nil {
		r.base.StartFailed()
		if errors.Is(context.Cause(checkCtx), idem.ErrStopped) {
			return fmt.Errorf("idem: relay: Stop was called during the start-up: %w", idem.ErrStopped)
		}
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
	if r.pauses.Load() != nil {
		wg.Go(r.pauseLoop)
	}
	go func() {
		wg.Wait()
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
// ends first, in-flight publications are cancelled and Stop returns ctx's
// error at once, while their rows are released in the background: Done is
// closed when everything has ended. Stop is idempotent and safe to call from
// several goroutines, before, during or after Start; on a relay that was
// never started it only prevents a later start.
func (r *Relay[TTx]) Stop(ctx context.Context) error {
	return r.base.Stop(ctx, func() { r.log.Info("relay stopping") }, nil)
}

// Done is closed when a started relay has stopped.
func (r *Relay[TTx]) Done() <-chan struct{} { return r.base.Done() }

// Stats returns a snapshot of the relay's counters.
func (r *Relay[TTx]) Stats() Stats {
	s := Stats{
		Claims:        r.stats.claims.Load(),
		Claimed:       r.stats.claimed.Load(),
		EmptyClaims:   r.stats.emptyClaims.Load(),
		Wakeups:       int64(r.signals.Load()),
		Published:     r.stats.published.Load(),
		PublishErrors: r.stats.publishErrors.Load(),
		Quarantined:   r.stats.quarantined.Load(),
		Takeovers:     r.stats.takeovers.Load(),
		LeasesLost:    r.stats.leasesLost.Load(),
		Released:      r.stats.released.Load(),
		Deleted:       r.stats.deleted.Load(),
		Backlog:       r.stats.backlog.Load(),
		Scheduled:     r.stats.scheduled.Load(),
		InFlight:      r.stats.inFlight.Load(),
		PausedRounds:  r.stats.pausedRounds.Load(),

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
	if p, ok := r.pauses.Load().Last(); ok {
		s.Paused = &p
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
	r.declared.Store(false)
	r.wakeOne()
}

// nudge wakes one idle worker to claim, whatever claims started since: rows
// are known to wait (more aggregates than a claim takes, or aggregates
// whose batch just ended).
func (r *Relay[TTx]) nudge() {
	r.nudged.Store(true)
	r.declared.Store(false)
	r.wakeOne()
}

func (r *Relay[TTx]) wakeOne() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
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
			r.declared.Store(false) // a new listener holds no lock yet
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
		d := backoff.Exponential(defaultListenRetry, listenRetryMax, failures)
		r.errs.listen.Warn(ctx, "listen for outbox notifications failed; polling until it reconnects", err, "retry_in", d.Round(time.Millisecond))
		if !ctxsleep.Sleep(ctx, d) {
			return
		}
	}
}

func (r *Relay[TTx]) retentionLoop() {
	ctx := r.claimCtx
	for {
		if !ctxsleep.Sleep(ctx, backoff.Jitter(r.cfg.RetentionInterval, pollJitter)) {
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
	r.stats.scheduled.Store(b.Scheduled)
	var oldest int64
	if !b.Oldest.IsZero() {
		oldest = b.Oldest.UnixNano()
	}
	r.stats.oldest.Store(oldest)
	r.stats.measuredAt.Store(time.Now().UnixNano())
	return nil
}
