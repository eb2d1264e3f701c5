package relay

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// Defaults of Config.
const (
	WorkersDefault         = 2
	BatchSizeDefault       = 1000
	MaxPerAggregateDefault = 100
	LeaseDefault           = 30 * time.Second
	PublishTimeoutDefault  = 10 * time.Second
	PollIntervalDefault    = time.Second
	// PollIntervalNoListenDefault is the poll interval when the database
	// cannot notify the relay (MySQL, SQLite, database/sql drivers, or
	// DisableListen): polling is then the only wake-up.
	PollIntervalNoListenDefault = 50 * time.Millisecond
	DebounceDefault             = 2 * time.Millisecond
	RetryBackoffDefault         = time.Second
	QuarantineAfterDefault      = 10
	MaxRetryBackoffDefault      = time.Minute
	RetentionDefault            = 7 * 24 * time.Hour
	RetentionIntervalDefault    = time.Minute
	DeleteBatchSizeDefault      = 1000
	StatsIntervalDefault        = 10 * time.Second
	QueryTimeoutDefault         = 30 * time.Second
)

// Config configures a Relay. The zero value is valid: every field has a
// default.
type Config struct {
	// Workers is the number of workers claiming and publishing batches
	// concurrently. Defaults to 2.
	Workers int
	// BatchSize is the maximum number of rows claimed at once. Defaults to
	// 1000. A claim takes at most BatchSize/2 aggregates (all of them with
	// one worker) and fills the rest of the batch with the rows that follow
	// theirs, so that with many aggregates another claim finds some too.
	BatchSize int
	// MaxPerAggregate is the maximum number of rows of one aggregate in a
	// claim. They are published one per Publish call, each after the
	// previous one was confirmed. Defaults to 100 (at most BatchSize); 1
	// claims only each aggregate's oldest unpublished row.
	MaxPerAggregate int
	// Lease is how long a claim is owned. A worker that has not marked or
	// released its rows by then loses them to any other worker (a crashed
	// or paused relay), and publishes no more of them. Defaults to 30s.
	Lease time.Duration
	// PublishTimeout bounds each Publish call. It must be shorter than 90%
	// of Lease: a worker only starts a Publish call that can end before its
	// lease does. Defaults to 10s (at most Lease/3).
	PublishTimeout time.Duration
	// PollInterval is how often an idle worker claims without being woken
	// by a notification, with ±20% jitter. Defaults to 1s when the driver
	// supports LISTEN/NOTIFY (pgx on PostgreSQL), 50ms otherwise.
	PollInterval time.Duration
	// MaxPollInterval, when set, makes idle workers back off: after a
	// claim that finds nothing, the next poll waits twice as long as the
	// previous one, up to MaxPollInterval; a poll that finds rows brings it
	// back to PollInterval (someone writes rows without notifying). A
	// notification from the database or Relay.Notify wakes a worker at once
	// and leaves the interval as it is: rows that are announced need no
	// poll. Processes that write their outbox rows themselves call
	// Relay.Notify after committing, so that a relay idle for a while picks
	// their rows up at once; rows of a process that does not are found
	// within MaxPollInterval. Zero (the default) polls every PollInterval.
	// It must not be shorter than PollInterval.
	MaxPollInterval time.Duration
	// BusyPollInterval, when positive, is how soon a worker whose last
	// round of claims found rows claims again, notified or not; a round that
	// finds nothing sends the worker back to waiting for a notification or
	// PollInterval. A relay that keeps up with a steady stream thus polls
	// at this pace, and on PostgreSQL its producers do not notify at all
	// (the outbox trigger notifies only while a relay waits), at the cost
	// of one claim that finds nothing after each burst. Zero (the default)
	// or negative: off, a relay that found nothing waits for the next
	// notification; measured at 1,000 events/s, that halved the median
	// commit-to-publish delay (docs/PERFORMANCE.md).
	BusyPollInterval time.Duration
	// Debounce is how long a worker woken by a notification waits before
	// claiming, so that a burst of inserts is one claim. Defaults to 2ms.
	Debounce time.Duration
	// DisableListen turns LISTEN/NOTIFY off: workers only poll.
	//
	// On PostgreSQL the outbox's insert trigger sends the notifications,
	// and every commit that sends one takes a lock global to the server
	// until its WAL flush is done, so such commits run one at a time (about
	// 2,000/s on the reference machine, against 5,000/s without). Since
	// migration 0006 the trigger notifies only while a relay waits for
	// rows (see the package documentation); with DisableListen no relay
	// waits, and inserts never notify. Writers that want no trigger at all
	// on a table can disable it
	// (ALTER TABLE outbox DISABLE TRIGGER outbox_notify) and run their
	// relays with DisableListen and a short PollInterval, or use the CDC
	// relay.
	DisableListen bool
	// RetryBackoff is the delay before a row whose publication failed is
	// tried again, doubled at each further failure, with jitter, up to
	// MaxRetryBackoff. The same delays pause every worker while the broker
	// fails whole calls. Defaults to 1s.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps RetryBackoff. Defaults to 1m.
	MaxRetryBackoff time.Duration
	// QuarantineAfter is the number of attempts on which the broker must
	// refuse a row itself (unroutable, nacked, rejected, too large: an
	// error for that message in a *broker.BatchError) before the relay
	// quarantines it. Defaults to 10, which with the default backoff is
	// about 4 minutes of refusals; negative retries refused rows forever.
	//
	// A quarantined row stays in the outbox, unpublished, with its error in
	// last_error; the later rows of its aggregate wait behind it, every
	// other aggregate goes on. Operators list, show, re-drive and remove
	// quarantined rows with "idem failed ... --relay" (or the
	// driver.RelayDialect methods). A row that cannot become a message (an
	// id that cannot become an event id, see idem.EventID; headers that are
	// not a JSON object, a missing event name...) is quarantined at its
	// first claim, whatever this setting: retrying cannot fix it.
	//
	// Failures that say the broker did not answer (the whole Publish call
	// failed, or per message: a deadline, a lost connection, an error
	// marked idem.Transient) never count: they pause the relay as the
	// RetryBackoff delays say, however long they last.
	QuarantineAfter int
	// Retention is how long published rows are kept before they are
	// deleted. It is the period that "idem replay" can re-publish: keep the
	// consumers' processed_event horizon at least this long. Defaults to 7
	// days; negative keeps published rows forever.
	Retention time.Duration
	// RetentionInterval is how often published rows older than Retention
	// are deleted. Defaults to 1m.
	RetentionInterval time.Duration
	// DeleteBatchSize is the number of rows deleted per statement. Defaults
	// to 1000.
	DeleteBatchSize int
	// StatsInterval is how often the backlog reported by Stats is
	// measured. Defaults to 10s; negative turns it off.
	StatsInterval time.Duration
	// OnQuarantine, when set, is called with the notice of each row the
	// relay quarantines (idem.FailureRowQuarantined: its table and seq,
	// class, group and error, its event's id, name and aggregate), in the
	// transaction that quarantines it: the notice exists if and only if
	// the quarantine committed. An error rolls that transaction back: the
	// row is tried again after its lease. outbox.FailureEvents writes the
	// notices into the outbox, which the relay then publishes for other
	// services to follow ("idem relay --failure-events"). Rows that are
	// themselves notices (idem.IsFailureNotice) get none.
	OnQuarantine func(ctx context.Context, ex driver.Executor, n idem.FailureNotice) error
	// QueryTimeout bounds each database call. Defaults to 30s.
	QueryTimeout time.Duration
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer is told what the relay does, for metrics: package
	// relay/relaymetrics makes one that feeds Prometheus.
	Observer Observer
	// TracerProvider gives the tracer of the relay's spans: one producer
	// span per published message, child of the producer's span whose
	// trace context outbox.Writer wrote in the row's headers. Defaults to
	// the global one (otel.GetTracerProvider), which records nothing until
	// the application installs an OpenTelemetry SDK.
	TracerProvider trace.TracerProvider
	// Propagator reads the producer's trace context from the rows' headers,
	// and writes the relay span's into the messages of rows that have none.
	// Defaults to the global one (otel.GetTextMapPropagator).
	Propagator propagation.TextMapPropagator
	// Now is the clock that says which delayed rows (idem.Event.NotBefore)
	// are due: each claim passes its time to the database, which makes the
	// rows due by then claimable. Leases are timed by the database's clock.
	// Defaults to time.Now; tests set a clock of their own.
	Now func() time.Time
}

// ClaimParams returns the parameters of the claims that a relay configured
// with c (with its defaults set) makes for owner.
func (c Config) ClaimParams(owner uuid.UUID) driver.ClaimParams {
	return driver.ClaimParams{
		Owner:           owner,
		Lease:           c.Lease,
		Limit:           c.BatchSize,
		MaxPerAggregate: c.MaxPerAggregate,
		// Half the batch's aggregates with two workers or more: with many
		// aggregates, one claim would otherwise take every head and leave
		// the next claim nothing to publish until it is marked. Not less:
		// smaller claims meant longer chains per aggregate and workers
		// slower the more of them there were.
		MaxHeads: (c.BatchSize + min(c.Workers, 2) - 1) / min(c.Workers, 2),
		Now:      c.now(),
	}
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Workers = cmp.Or(c.Workers, WorkersDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	if c.MaxPerAggregate == 0 {
		c.MaxPerAggregate = min(MaxPerAggregateDefault, c.BatchSize)
	}
	c.Lease = cmp.Or(c.Lease, LeaseDefault)
	if c.PublishTimeout == 0 {
		c.PublishTimeout = min(PublishTimeoutDefault, c.Lease/3)
	}
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.Debounce = cmp.Or(c.Debounce, DebounceDefault)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, RetryBackoffDefault)
	c.MaxRetryBackoff = cmp.Or(c.MaxRetryBackoff, max(MaxRetryBackoffDefault, c.RetryBackoff))
	c.QuarantineAfter = cmp.Or(c.QuarantineAfter, QuarantineAfterDefault)
	c.Retention = cmp.Or(c.Retention, RetentionDefault)
	c.RetentionInterval = cmp.Or(c.RetentionInterval, RetentionIntervalDefault)
	c.DeleteBatchSize = cmp.Or(c.DeleteBatchSize, DeleteBatchSizeDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, StatsIntervalDefault)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, QueryTimeoutDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	positive := []struct {
		field string
		v     int64
	}{
		{"Workers", int64(c.Workers)}, {"BatchSize", int64(c.BatchSize)},
		{"MaxPerAggregate", int64(c.MaxPerAggregate)}, {"Lease", int64(c.Lease)},
		{"PublishTimeout", int64(c.PublishTimeout)}, {"PollInterval", int64(c.PollInterval)},
		{"Debounce", int64(c.Debounce)}, {"RetryBackoff", int64(c.RetryBackoff)},
		{"MaxRetryBackoff", int64(c.MaxRetryBackoff)}, {"RetentionInterval", int64(c.RetentionInterval)},
		{"DeleteBatchSize", int64(c.DeleteBatchSize)}, {"QueryTimeout", int64(c.QueryTimeout)},
	}
	for _, p := range positive {
		if p.v <= 0 {
			return fmt.Errorf("idem: relay: Config.%s is %d; want a positive value (or zero for the default)", p.field, p.v)
		}
	}
	switch {
	case c.PublishTimeout+c.leaseMargin() >= c.Lease:
		return fmt.Errorf("idem: relay: Config.PublishTimeout %v must be shorter than 90%% of Config.Lease %v, or a slow publish would outlive its lease", c.PublishTimeout, c.Lease)
	case c.MaxRetryBackoff < c.RetryBackoff:
		return fmt.Errorf("idem: relay: Config.MaxRetryBackoff %v is shorter than Config.RetryBackoff %v", c.MaxRetryBackoff, c.RetryBackoff)
	case c.MaxPollInterval < 0:
		return fmt.Errorf("idem: relay: Config.MaxPollInterval is %v; want zero (no backoff) or a duration not shorter than Config.PollInterval", c.MaxPollInterval)
	case c.MaxPollInterval > 0 && c.MaxPollInterval < c.PollInterval:
		return fmt.Errorf("idem: relay: Config.MaxPollInterval %v is shorter than Config.PollInterval %v", c.MaxPollInterval, c.PollInterval)
	case c.MaxPerAggregate > c.BatchSize:
		return fmt.Errorf("idem: relay: Config.MaxPerAggregate %d is larger than Config.BatchSize %d", c.MaxPerAggregate, c.BatchSize)
	}
	return nil
}

// now returns the time of c.Now, or of time.Now when it is nil.
func (c Config) now() time.Time {
	if c.Now == nil {
		return time.Now()
	}
	return c.Now()
}

// leaseMargin is the part of the lease kept free after the last Publish
// call, for the mark.
func (c Config) leaseMargin() time.Duration { return c.Lease / 10 }
