// Package inbox is the idempotent consumer: it applies each event's database
// effects exactly once per consumer name, although brokers deliver at least
// once.
//
// For each delivery the consumer begins a transaction, inserts (consumer name,
// event id) into processed_event with INSERT ... ON CONFLICT DO NOTHING, and
//
//   - if no row was inserted, the event was already applied: it commits,
//     calls no handler and reports Duplicate;
//   - otherwise it calls every handler registered for the event name with the
//     transaction, and commits; a handler error rolls the marker back with the
//     effects, so a retry processes the event again.
//
// Only the conflict on that key means "duplicate"; any other error is an
// error. Two workers receiving the same event at the same moment are ordered by
// the primary key: the second insert waits for the first transaction, then
// inserts nothing if it committed, or goes on if it rolled back.
//
// The deduplication happens once per event for all of its handlers, like a
// middleware, rather than in each handler, where the first handler's marker
// would make the second one skip.
//
// Transports (broker/amqp, broker/kafka, broker/nats) feed the consumer through
// DeliverBatch, which also decodes messages and sorts failures: a fault of a
// dependency (the consumer's database, the network, a downstream service a
// handler reports with idem.Transient) pauses consumption without counting
// an attempt; bad input (undecodable, idem.Permanent) is parked at once in
// the failure store; other handler errors are retried by the RetryPolicy,
// with attempts counted in the database, then parked. The events of one
// aggregate keep their order through retries and parking.
//
// Handlers reject input they can never apply with idem.Permanent, and
// report a dependency that is away with idem.Transient:
//
//	c.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
//		var p OrderPlaced
//		if err := json.Unmarshal(ev.Payload, &p); err != nil || p.Quantity <= 0 {
//			return idem.Permanent(fmt.Errorf("impossible order: %v", err)) // parked at once
//		}
//		if err := carrier.RequestPickup(ctx, p.OrderID); err != nil {
//			return idem.Transient(err) // the carrier is away: pause, retry, count nothing
//		}
//		...
//	})
package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/mutant"
	"github.com/idem-go/idem/internal/pausewatch"
)

// HandlerFunc applies an event's effects using tx, the consumer's
// transaction, in the form the application uses (pgx.Tx, *sql.Tx). It must not
// commit or roll back tx. Returning an error rolls back every effect of the
// event; wrap it with idem.Permanent when retrying cannot help.
type HandlerFunc[TTx any] func(ctx context.Context, tx TTx, ev idem.Event) error

// AnyEvent registers a handler for every event name.
const AnyEvent = "*"

// Outcome says what processing did with an event (broker.Outcome).
type Outcome = broker.Outcome

// Outcomes: see broker.Outcome.
const (
	Applied   = broker.Applied
	Duplicate = broker.Duplicate
	Ignored   = broker.Ignored
	Failed    = broker.Failed
	Parked    = broker.Parked
	Deferred  = broker.Deferred
	Paused    = broker.Paused
)

// Defaults of Config.
const (
	// DeliveryTimeoutDefault bounds the processing of one delivery.
	DeliveryTimeoutDefault = 30 * time.Second
	// OutageBudgetDefault is how long an event may fail transiently before
	// its failures count as attempts: long enough to ride out an outage of
	// a few minutes.
	OutageBudgetDefault = 10 * time.Minute
	// PauseMinDefault and PauseMaxDefault bound the pause after a transient
	// failure.
	PauseMinDefault = 100 * time.Millisecond
	PauseMaxDefault = 2 * time.Second
)

// ParkedPolicy says what a parked event does to the later events of its
// aggregate.
type ParkedPolicy int

// Parked policies.
const (
	// HoldAggregate (the default): while an event is parked, the later
	// events of its aggregate that reach the consumer are parked behind it
	// (not applied), so that the aggregate's events are never applied out
	// of order. "idem failed retry" of the first one re-drives them after
	// it; removing it releases the aggregate.
	HoldAggregate ParkedPolicy = iota
	// ReleaseAggregate: a parked event holds nothing back; the later events
	// of its aggregate are applied.
	ReleaseAggregate
)

// Config configures a Consumer.
type Config struct {
	// Name identifies the consumer in processed_event and failed_message, for
	// example "stock" or "shipping-preparation-v1". Keep it stable across
	// instances and deployments: a new name processes every event again.
	// Required.
	Name string
	// Retry is the retry policy Deliver applies to handler failures.
	// Defaults to RetryPolicy{}.WithDefaults().
	Retry RetryPolicy
	// Decoder decodes messages in Deliver. The zero value accepts bodies up to
	// idem.DefaultMaxBodyBytes.
	Decoder idem.Decoder
	// DeliveryTimeout bounds the processing of one delivery in Deliver (of
	// one batch, when DeliverBatch applies several in one transaction): the
	// handlers' context ends then, the transaction rolls back, and the
	// failure counts as transient. Defaults to 30s.
	DeliveryTimeout time.Duration
	// OutageBudget is how long an event may keep failing transiently (see
	// Deliver) before its failures count as attempts of the retry policy.
	// Until then it is tried again, consumption paused, without limit.
	// Defaults to 10m.
	OutageBudget time.Duration
	// PauseMin and PauseMax bound the exponential, jittered pause after a
	// transient failure. The consumer tries once per pause, so it resumes
	// within about PauseMax of a dependency's return. Default to 100ms and
	// 2s.
	PauseMin, PauseMax time.Duration
	// Parked says what a parked event does to the later events of its
	// aggregate. Defaults to HoldAggregate.
	Parked ParkedPolicy
	// Logger receives warnings (parked messages, pauses, version gaps).
	// Defaults to slog.Default().
	Logger *slog.Logger
	// Observer is told what the consumer does, for metrics
	// (inbox/inboxmetrics). The zero value observes nothing.
	Observer Observer
	// TracerProvider gives the tracer of the spans DeliverBatch starts: one
	// consumer span per delivery, child of the producer's span found in the
	// message's headers, around its handlers. Defaults to the global one
	// (otel.GetTracerProvider), which records nothing until the application
	// installs an OpenTelemetry SDK.
	TracerProvider trace.TracerProvider
	// Propagator extracts the producer's trace context from the messages'
	// headers. Defaults to the global one (otel.GetTextMapPropagator).
	Propagator propagation.TextMapPropagator
	// RateLimit caps the events this consumer processes per second, in
	// this process, over every worker of its transport (a token bucket),
	// so that a backlog after an outage does not hit a rate-limited
	// downstream at full speed. N replicas take up to N times as many. A
	// delivery waits for its token (at most RateWaitMax, else it is handed
	// back to the transport); waiting never counts an attempt nor parks a
	// message. Limits make DeliverBatch process its deliveries one at a
	// time, each in its own transaction. 0 (the default) sets no limit.
	RateLimit float64
	// RateBurst is the bucket's size: how many events may go at once
	// after a quiet time. Defaults to one second's worth of RateLimit
	// (rounded up), at least 1.
	RateBurst int
	// KeyLimit caps the events of one key (Key) this consumer processes
	// per second, in this process: per customer, per aggregate. A
	// delivery whose key is over its limit for longer than RateWaitMax is
	// handed back (Action Retry, Outcome Deferred, no attempt counted),
	// and the later events of its aggregate wait behind it; other keys go
	// on. 0 (the default) sets no limit.
	KeyLimit float64
	// KeyBurst is the bucket's size of each key. Defaults to one second's
	// worth of KeyLimit (rounded up), at least 1.
	KeyBurst int
	// Key returns the key of KeyLimit of an event; "" sets no limit on
	// it. Defaults to AggregateKey (the event's aggregate).
	Key func(idem.Event) string
	// MaxConcurrent caps the deliveries this consumer processes at once,
	// in this process, over every worker of its transport. 0 (the
	// default) sets no limit.
	MaxConcurrent int
	// RateWaitMax is the longest a delivery waits for RateLimit, KeyLimit
	// or a MaxConcurrent slot before it is handed back to the transport,
	// to be delivered again when it is due. Keep it well below the
	// transport's redelivery timeouts (RabbitMQ's consumer_timeout, NATS's
	// AckWait: the subscribers tell the broker a message is in progress
	// while it is being handled, but a wait of minutes holds a worker).
	// Defaults to 5s.
	RateWaitMax time.Duration
	// PauseCheck is how often the consumer reads its operator's pause
	// (PauseStore) from its database: a pause takes effect within
	// PauseCheck on every replica, and while it holds, the transport
	// delivers the messages again, to be handed back again, every
	// PauseCheck, so that a resume is seen within about twice PauseCheck.
	// Defaults to 1s.
	PauseCheck time.Duration
	// OnFailure, when set, is called with a notice of each message the
	// consumer parks (idem.FailureMessageParked, held messages included),
	// in the transaction that parks it, and of each parked message it
	// applies after a retry (idem.FailureMessageResolved, ResolvedRetried),
	// in the transaction that removes it from the failure store: the notice
	// exists if and only if the park or the removal committed. An error
	// rolls that transaction back: the message is not parked (the
	// transport delivers it again) or stays in the store.
	// outbox.FailureEvents writes the notices as events into the
	// consumer's database's outbox, for other services to follow; any
	// other function may do what the application needs in that
	// transaction. Messages that are themselves notices
	// (idem.IsFailureNotice) get none. The consumer's FailureStore
	// (Failures) calls it too, for the entries it removes, archives or
	// redirects.
	OnFailure FailureHook
	// Now is the consumer's clock: when a pause after a transient failure
	// ends, how long an event has failed transiently (OutageBudget), when
	// an operator's pause begins and ends, and when it is read again
	// (PauseCheck).
	// Tests set it to a clock they advance (idemtest.Clock) to see pauses
	// end and the outage budget run out without waiting. Defaults to
	// time.Now.
	Now func() time.Time
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Retry = c.Retry.WithDefaults()
	c.DeliveryTimeout = cmp.Or(c.DeliveryTimeout, DeliveryTimeoutDefault)
	c.OutageBudget = cmp.Or(c.OutageBudget, OutageBudgetDefault)
	c.PauseMin = cmp.Or(c.PauseMin, PauseMinDefault)
	c.PauseMax = cmp.Or(c.PauseMax, PauseMaxDefault)
	c.PauseCheck = cmp.Or(c.PauseCheck, PauseCheckDefault)
	c.RateBurst = cmp.Or(c.RateBurst, burstFor(c.RateLimit))
	c.KeyBurst = cmp.Or(c.KeyBurst, burstFor(c.KeyLimit))
	c.RateWaitMax = cmp.Or(c.RateWaitMax, RateWaitMaxDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`)

func (c Config) validate() error {
	if c.Name == "" {
		return errors.New("idem: inbox: Config.Name is required (a stable consumer name such as \"stock\")")
	}
	if !nameRE.MatchString(c.Name) {
		return fmt.Errorf("idem: inbox: Config.Name %q must be 1-200 letters, digits, '.', '_', ':' or '-'", c.Name)
	}
	switch {
	case c.DeliveryTimeout < 0:
		return fmt.Errorf("idem: inbox: Config.DeliveryTimeout %v is negative", c.DeliveryTimeout)
	case c.OutageBudget < 0:
		return fmt.Errorf("idem: inbox: Config.OutageBudget %v is negative", c.OutageBudget)
	case c.PauseMin < 0 || c.PauseMax < 0 || (c.PauseMax > 0 && c.PauseMin > c.PauseMax):
		return fmt.Errorf("idem: inbox: Config.PauseMin %v and PauseMax %v: want 0 <= PauseMin <= PauseMax", c.PauseMin, c.PauseMax)
	case c.RateLimit < 0 || c.KeyLimit < 0 || math.IsNaN(c.RateLimit) || math.IsNaN(c.KeyLimit) || math.IsInf(c.RateLimit, 0) || math.IsInf(c.KeyLimit, 0):
		return fmt.Errorf("idem: inbox: Config.RateLimit %v and KeyLimit %v: want 0 (no limit) or a positive number of events per second", c.RateLimit, c.KeyLimit)
	case c.RateBurst < 0 || c.KeyBurst < 0:
		return fmt.Errorf("idem: inbox: Config.RateBurst %d and KeyBurst %d: want 0 (the default) or more", c.RateBurst, c.KeyBurst)
	case c.MaxConcurrent < 0:
		return fmt.Errorf("idem: inbox: Config.MaxConcurrent %d is negative", c.MaxConcurrent)
	case c.RateWaitMax < 0:
		return fmt.Errorf("idem: inbox: Config.RateWaitMax %v is negative", c.RateWaitMax)
	case c.PauseCheck < 0:
		return fmt.Errorf("idem: inbox: Config.PauseCheck %v is negative", c.PauseCheck)
	case c.Parked != HoldAggregate && c.Parked != ReleaseAggregate:
		return fmt.Errorf("idem: inbox: Config.Parked %d: want HoldAggregate or ReleaseAggregate", c.Parked)
	}
	return c.Retry.validate()
}

// Consumer is an idempotent consumer with handlers per event name. Register
// handlers before processing; a Consumer is then safe for concurrent use by
// many workers.
type Consumer[TTx any] struct {
	cfg      Config
	drv      driver.Driver[TTx]
	failures *FailureStore
	log      *slog.Logger

	mu       sync.RWMutex
	handlers map[string][]HandlerFunc[TTx]

	gate      gate
	failing   eventTimes // first transient failure per event
	attempted eventTimes // events with failed attempts counted in the database
	parked    parkedCache
	pauses    *pausewatch.Watch // the operator's pause
	limits    *limits           // nil without limits

	stats   stats
	tracing tracing
}

// New returns a consumer named cfg.Name on drv.
func New[TTx any](drv driver.Driver[TTx], cfg Config) (*Consumer[TTx], error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	c := &Consumer[TTx]{
		cfg:      cfg,
		drv:      drv,
		failures: newFailureStore(drv).WithFailureHook(cfg.OnFailure),
		log:      cfg.Logger.With("consumer", cfg.Name),
		handlers: map[string][]HandlerFunc[TTx]{},
		tracing:  newTracing(cfg),
	}
	c.gate.pauses, c.gate.now = backoff.Backoff{Base: cfg.PauseMin, Max: cfg.PauseMax}, cfg.Now
	c.limits = newLimits(cfg)
	c.pauses = pausewatch.New(idem.PauseConsumer, cfg.Name, drv.Dialect(), drv.Pool(), cfg.PauseCheck, cfg.Now, c.log)
	return c, nil
}

// Name returns the consumer name.
func (c *Consumer[TTx]) Name() string { return c.cfg.Name }

// Driver returns the consumer's driver, for handlers that need its executor
// (c.Driver().Tx(tx)) with helpers such as StateCopy.
func (c *Consumer[TTx]) Driver() driver.Driver[TTx] { return c.drv }

// Failures returns the consumer's failure store.
func (c *Consumer[TTx]) Failures() *FailureStore { return c.failures }

// Handle registers h for events named eventName (AnyEvent for all). Handlers
// of one event run in registration order, in one transaction.
func (c *Consumer[TTx]) Handle(eventName string, h HandlerFunc[TTx]) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handlers[eventName] = append(c.handlers[eventName], h)
}

// Handles reports whether a handler is registered for eventName.
func (c *Consumer[TTx]) Handles(eventName string) bool {
	return len(c.handlersFor(eventName)) > 0
}

// EventNames returns the event names with handlers (AnyEvent included).
func (c *Consumer[TTx]) EventNames() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	names := make([]string, 0, len(c.handlers))
	for n := range c.handlers {
		names = append(names, n)
	}
	return names
}

func (c *Consumer[TTx]) handlersFor(name string) []HandlerFunc[TTx] {
	c.mu.RLock()
	defer c.mu.RUnlock()
	hs := c.handlers[name]
	if any := c.handlers[AnyEvent]; len(any) > 0 && name != AnyEvent {
		hs = append(append([]HandlerFunc[TTx](nil), hs...), any...)
	}
	return hs
}

// HandlerError is returned when a handler fails. The transaction was rolled
// back: neither the effects nor the processed_event marker exist.
type HandlerError struct {
	EventID   uuid.UUID
	EventName string
	Err       error
}

// Error implements error.
func (e *HandlerError) Error() string {
	return fmt.Sprintf("idem: handling %s %s: %v", e.EventName, e.EventID, e.Err)
}

// Unwrap returns the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// Process applies ev once: see the package documentation. It returns Applied,
// Duplicate or Ignored with a nil error, or Failed with the error (a
// *HandlerError when a handler failed).
func (c *Consumer[TTx]) Process(ctx context.Context, ev idem.Event) (Outcome, error) {
	o, err := c.process(ctx, ev)
	c.countResults([]idem.Event{ev}, []Result{{Outcome: o}})
	return o, err
}

func (c *Consumer[TTx]) process(ctx context.Context, ev idem.Event) (_ Outcome, err error) {
	hs := c.handlersFor(ev.Name)
	if len(hs) == 0 {
		return Ignored, nil
	}
	if ev.ID == uuid.Nil {
		return Failed, idem.Permanent(errors.New("idem: inbox: event has no id"))
	}
	tx, err := c.drv.Begin(ctx)
	if err != nil {
		return Failed, fmt.Errorf("idem: inbox %s: begin: %w", c.cfg.Name, err)
	}
	defer func() {
		if err != nil {
			_ = c.drv.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	hash := contentHash(ev)
	inserted, err := c.drv.Dialect().MarkProcessed(ctx, c.drv.Tx(tx), c.cfg.Name, []driver.Mark{{ID: ev.ID, Hash: hash}})
	if err != nil {
		return Failed, fmt.Errorf("idem: inbox %s: mark %s processed: %w", c.cfg.Name, ev.ID, err)
	}
	if !inserted[0] && !(mutant.Enabled && c.skipDedup()) {
		if err := c.checkContent(ctx, c.drv.Tx(tx), []idem.Event{ev}, []int64{hash}); err != nil {
			return Failed, err
		}
		if err := c.drv.Commit(ctx, tx); err != nil {
			return Failed, fmt.Errorf("idem: inbox %s: commit: %w", c.cfg.Name, err)
		}
		return Duplicate, nil
	}
	if err := c.runHandlers(ctx, tx, ev, hs); err != nil {
		return Failed, err
	}
	if err := c.drv.Commit(ctx, tx); err != nil {
		return Failed, fmt.Errorf("idem: inbox %s: commit: %w", c.cfg.Name, err)
	}
	return Applied, nil
}

// skipDedup reports whether the mutant InboxSkipDedup has this consumer
// apply events that its markers say were applied already. Callers guard
// it with mutant.Enabled, so that builds without the tag idemmutant have
// no call at all.
func (c *Consumer[TTx]) skipDedup() bool {
	if !mutant.On(mutant.InboxSkipDedup) {
		return false
	}
	name := mutant.Arg(mutant.InboxSkipDedup)
	return name == "" || name == c.cfg.Name
}

func (c *Consumer[TTx]) runHandlers(ctx context.Context, tx TTx, ev idem.Event, hs []HandlerFunc[TTx]) (err error) {
	defer c.timeHandlers()()
	defer func() {
		if r := recover(); r != nil {
			err = &HandlerError{EventID: ev.ID, EventName: ev.Name, Err: fmt.Errorf("panic: %v", r)}
		}
	}()
	for _, h := range hs {
		if herr := h(ctx, tx, ev); herr != nil {
			return &HandlerError{EventID: ev.ID, EventName: ev.Name, Err: herr}
		}
	}
	return nil
}

// Result is the outcome of one event of a batch.
type Result struct {
	Outcome Outcome
	Err     error
}

// ProcessBatch applies up to len(events) events in one transaction, with one
// marker each, which costs one commit instead of one per event. If any handler
// fails, the whole transaction rolls back and the events are processed again
// one at a time, so one bad event does not fail its neighbours. An event id
// repeated within the batch is a Duplicate after its first occurrence.
func (c *Consumer[TTx]) ProcessBatch(ctx context.Context, events []idem.Event) []Result {
	results := make([]Result, len(events))
	if len(events) == 0 {
		return results
	}
	c.observeBatch(len(events))
	if len(events) == 1 {
		o, err := c.process(ctx, events[0])
		results[0] = Result{o, err}
		c.countResults(events, results)
		return results
	}
	err := c.batch(ctx, events, results, nil)
	if err != nil {
		for i, ev := range events {
			o, err := c.process(ctx, ev)
			results[i] = Result{o, err}
		}
	}
	c.countResults(events, results)
	return results
}

// batch tries the whole batch in one transaction. It fills results and
// returns nil on commit; on any error results are meaningless. items, when
// not nil, are the deliveries of the events, whose trace spans the
// handlers' contexts carry.
func (c *Consumer[TTx]) batch(ctx context.Context, events []idem.Event, results []Result, items []item) (err error) {
	marks := make([]driver.Mark, 0, len(events))
	pos := make([]int, 0, len(events))
	seen := make(map[uuid.UUID]bool, len(events))
	handlers := make([][]HandlerFunc[TTx], len(events))
	for i, ev := range events {
		hs := c.handlersFor(ev.Name)
		switch {
		case len(hs) == 0:
			results[i] = Result{Outcome: Ignored}
		case ev.ID == uuid.Nil:
			return errors.New("event without id")
		case seen[ev.ID]:
			results[i] = Result{Outcome: Duplicate}
		default:
			seen[ev.ID] = true
			handlers[i] = hs
			marks = append(marks, driver.Mark{ID: ev.ID, Hash: contentHash(ev)})
			pos = append(pos, i)
		}
	}
	if len(marks) == 0 {
		return nil
	}
	tx, err := c.drv.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = c.drv.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	inserted, err := c.drv.Dialect().MarkProcessed(ctx, c.drv.Tx(tx), c.cfg.Name, marks)
	if err != nil {
		return err
	}
	var dups []idem.Event
	var dupHashes []int64
	for k, i := range pos {
		if !inserted[k] && !(mutant.Enabled && c.skipDedup()) {
			results[i] = Result{Outcome: Duplicate}
			dups = append(dups, events[i])
			dupHashes = append(dupHashes, marks[k].Hash)
			continue
		}
		hctx := ctx
		if items != nil {
			hctx = itemContext(ctx, &items[i])
		}
		if err := c.runHandlers(hctx, tx, events[i], handlers[i]); err != nil {
			return err
		}
		results[i] = Result{Outcome: Applied}
	}
	if len(dups) > 0 {
		if err := c.checkContent(ctx, c.drv.Tx(tx), dups, dupHashes); err != nil {
			return err
		}
	}
	return c.drv.Commit(ctx, tx)
}

// Stats is a snapshot of a consumer's counters since it was created.
type Stats struct {
	Applied, Duplicates, Ignored, Failed, Parked uint64
	// Deferred counts deliveries not attempted because an earlier event of
	// their aggregate waited for a retry or a pause, or a limit held them.
	Deferred uint64
	// Paused counts deliveries the consumer paused on: it or a dependency
	// failed transiently, or an operator paused it.
	Paused uint64
	// OperatorPaused counts the deliveries handed back to the transport,
	// before any handler ran, while an operator's pause was in force
	// (PauseStore); Paused includes them.
	OperatorPaused uint64
	// HeldBack counts messages parked behind an earlier parked event of
	// their aggregate (Config.Parked HoldAggregate); Parked includes them.
	HeldBack uint64
	// Conflicts counts duplicates whose content (name, aggregate, payload)
	// differs from the event first processed with their id.
	Conflicts uint64
	// PausedSince is when the current pause began; zero while the consumer
	// runs.
	PausedSince time.Time
	// RateLimited counts the deliveries handed back to the transport,
	// unprocessed, because a limit (Config.RateLimit, KeyLimit,
	// MaxConcurrent) would have held them longer than RateWaitMax;
	// Deferred includes them.
	RateLimited uint64
	// RateWait is the time deliveries spent waiting for the limits, added
	// over every worker.
	RateWait time.Duration
	// OperatorPause is the operator's pause in force when the consumer
	// last read it; zero when none is (Kind is empty).
	OperatorPause idem.Pause
}

// Stats returns the consumer's counters.
func (c *Consumer[TTx]) Stats() Stats {
	st := Stats{
		Applied:     c.stats.applied.Load(),
		Duplicates:  c.stats.duplicates.Load(),
		Ignored:     c.stats.ignored.Load(),
		Failed:      c.stats.failed.Load(),
		Parked:      c.stats.parked.Load(),
		Deferred:    c.stats.deferred.Load(),
		Paused:      c.stats.paused.Load(),
		HeldBack:    c.stats.heldBack.Load(),
		Conflicts:   c.stats.conflicts.Load(),
		PausedSince: c.gate.pausedSince(),

		OperatorPaused: c.stats.operatorPaused.Load(),
		RateLimited:    c.stats.rateLimited.Load(),
		RateWait:       time.Duration(c.stats.rateWait.Load()),
	}
	st.OperatorPause, _ = c.pauses.Last()
	return st
}

type stats struct {
	applied, duplicates, ignored, failed, parked atomic.Uint64
	deferred, paused, heldBack, conflicts        atomic.Uint64
	operatorPaused, rateLimited, rateWait        atomic.Uint64
}

func (s *stats) count(o Outcome) {
	switch o {
	case Applied:
		s.applied.Add(1)
	case Duplicate:
		s.duplicates.Add(1)
	case Ignored:
		s.ignored.Add(1)
	case Failed:
		s.failed.Add(1)
	case Parked:
		s.parked.Add(1)
	case Deferred:
		s.deferred.Add(1)
	case Paused:
		s.paused.Add(1)
	}
}
