// Package inboxmetrics exports an idempotent consumer's metrics to
// Prometheus, whatever its transport: RabbitMQ, Kafka and NATS subscribers
// all feed inbox.Consumer.DeliverBatch, which tells the metrics through
// inbox.Config.Observer.
//
//	m := inboxmetrics.New("stock", inboxmetrics.Options{})
//	c, err := inbox.New(drv, inbox.Config{Name: "stock", Observer: m.Observer()})
//	...
//	m.Watch(c)                // Stats and the database figures
//	registry.MustRegister(m)  // one collector per consumer; they share a registry
//
// Metrics (label consumer = the consumer's name on each; outcome on the
// first):
//
//	idem_consumer_deliveries_total{outcome}    counter    deliveries by outcome: applied, duplicate, ignored,
//	                                                      retried, paused, deferred, parked
//	idem_consumer_handler_duration_seconds     histogram  time in the handlers of one event (without the commit)
//	idem_consumer_commit_to_handle_seconds     histogram  an applied event's occurred_at to the end of its handling
//	idem_consumer_batch_size                   histogram  deliveries per DeliverBatch (and ProcessBatch) call
//	idem_consumer_parked_messages              gauge      the consumer's messages in failed_message
//	idem_consumer_retry_backlog                gauge      events that failed, waiting for a retry (delivery_attempt)
//	idem_consumer_paused                       gauge      1 while the consumer is paused: a dependency is away
//
// The outcomes: applied (handlers ran, effects committed), duplicate (already
// applied: skipped), ignored (no handler for the event name), retried (a
// handler failed; the transport delivers it again after the retry policy's
// delay), paused (not attempted, or failed transiently: a dependency is
// away), deferred (not attempted: an earlier event of its aggregate waits
// for a retry or a pause), parked (put in the failure store).
//
// parked_messages and retry_backlog are read from the consumer's database
// (inbox.Consumer.FailureCounts, one cheap query) when Prometheus scrapes,
// at most once per Options.Refresh (5 seconds by default): they are at most
// that old. When the database cannot be read, both are left out of the
// scrape (alert on their absence too). paused is the consumer's own state in
// this process (inbox.Stats.PausedSince), as fresh as the scrape.
//
// commit_to_handle_seconds measures the delay the second source article
// asks to watch, from the producer's clock (occurred_at, set when the event
// was created, before its commit) to the consumer's: clocks apart by more
// than the delays measured make it meaningless.
package inboxmetrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
)

// Defaults of Options.
const (
	RefreshDefault      = 5 * time.Second
	QueryTimeoutDefault = 5 * time.Second
)

// HandlerBuckets returns the buckets of the handler duration histogram, in
// seconds.
func HandlerBuckets() []float64 {
	return []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
}

// DelayBuckets returns the buckets of the commit-to-handle delay histogram,
// in seconds.
func DelayBuckets() []float64 {
	return []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
}

// BatchBuckets returns the buckets of the batch size histogram, in
// deliveries.
func BatchBuckets() []float64 { return []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000} }

// Options configures Metrics. The zero value is valid.
type Options struct {
	// Refresh is how old the database figures (parked_messages,
	// retry_backlog) may be: a scrape reads them again when the last
	// reading is older. Defaults to 5s.
	Refresh time.Duration
	// QueryTimeout bounds the reading. Defaults to 5s.
	QueryTimeout time.Duration
}

// Source is what Metrics watches: an *inbox.Consumer of any transaction
// type has it.
type Source interface {
	Name() string
	Stats() inbox.Stats
	FailureCounts(ctx context.Context) (driver.ConsumerCounts, error)
}

// outcomes are the values of the outcome label, by inbox.Outcome.
var outcomes = map[inbox.Outcome]string{
	inbox.Applied:   "applied",
	inbox.Duplicate: "duplicate",
	inbox.Ignored:   "ignored",
	inbox.Failed:    "retried",
	inbox.Paused:    "paused",
	inbox.Deferred:  "deferred",
	inbox.Parked:    "parked",
}

// Metrics is a prometheus.Collector of one consumer's metrics. Create it
// with New, give its Observer to the consumer's Config, then Watch the
// consumer.
type Metrics struct {
	name string
	opts Options

	deliveries *prometheus.CounterVec
	byOutcome  [8]prometheus.Counter // by inbox.Outcome
	handler    prometheus.Histogram
	delay      prometheus.Histogram
	batch      prometheus.Histogram

	parked, backlog, paused *prometheus.Desc

	mu      sync.Mutex
	src     Source
	counts  driver.ConsumerCounts
	readAt  time.Time
	readErr error
}

var _ prometheus.Collector = (*Metrics)(nil)

// New returns the metrics of the consumer named consumer (its
// inbox.Config.Name), labelled consumer="<consumer>".
func New(consumer string, opts Options) *Metrics {
	if opts.Refresh <= 0 {
		opts.Refresh = RefreshDefault
	}
	if opts.QueryTimeout <= 0 {
		opts.QueryTimeout = QueryTimeoutDefault
	}
	cl := prometheus.Labels{"consumer": consumer}
	m := &Metrics{
		name: consumer,
		opts: opts,
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "idem_consumer_deliveries_total",
			Help:        "Deliveries settled by the consumer, by outcome: applied, duplicate, ignored, retried, paused, deferred, parked.",
			ConstLabels: cl,
		}, []string{"outcome"}),
		handler: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "idem_consumer_handler_duration_seconds",
			Help:        "Time the handlers of one event took, in the consumer's transaction, without the commit.",
			Buckets:     HandlerBuckets(),
			ConstLabels: cl,
		}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "idem_consumer_commit_to_handle_seconds",
			Help:        "Delay from an applied event's occurred_at (producer's clock) to the end of its handling (consumer's clock).",
			Buckets:     DelayBuckets(),
			ConstLabels: cl,
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "idem_consumer_batch_size",
			Help:        "Deliveries per batch handed to the consumer.",
			Buckets:     BatchBuckets(),
			ConstLabels: cl,
		}),
		parked: prometheus.NewDesc("idem_consumer_parked_messages",
			"Messages of the consumer in the failure store (failed_message): re-drive or remove them with idem failed.", nil, cl),
		backlog: prometheus.NewDesc("idem_consumer_retry_backlog",
			"Events of the consumer that failed and wait for a retry (delivery_attempt rows not yet applied or parked).", nil, cl),
		paused: prometheus.NewDesc("idem_consumer_paused",
			"1 while the consumer is paused because a dependency is away (its database, the network, a downstream service).", nil, cl),
	}
	for o, label := range outcomes {
		m.byOutcome[o] = m.deliveries.WithLabelValues(label)
	}
	return m
}

// Observer returns the hooks to set as inbox.Config.Observer.
func (m *Metrics) Observer() inbox.Observer {
	return inbox.Observer{
		Batch:   func(n int) { m.batch.Observe(float64(n)) },
		Settled: m.settled,
		Handled: func(d time.Duration) { m.handler.Observe(d.Seconds()) },
	}
}

func (m *Metrics) settled(s inbox.Settlement) {
	if int(s.Outcome) < len(m.byOutcome) && m.byOutcome[s.Outcome] != nil {
		m.byOutcome[s.Outcome].Inc()
	}
	if s.Outcome == inbox.Applied && !s.Event.OccurredAt.IsZero() {
		m.delay.Observe(max(0, s.At.Sub(s.Event.OccurredAt).Seconds()))
	}
}

// Watch sets the consumer whose state (paused) and database figures
// (parked messages, retry backlog) are exported. Its name must be the one
// given to New.
func (m *Metrics) Watch(src Source) {
	if src != nil && src.Name() != m.name {
		panic("inboxmetrics: Watch of consumer " + src.Name() + " on the metrics of consumer " + m.name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.src = src
	m.readAt = time.Time{}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.deliveries.Describe(ch)
	m.handler.Describe(ch)
	m.delay.Describe(ch)
	m.batch.Describe(ch)
	ch <- m.parked
	ch <- m.backlog
	ch <- m.paused
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.deliveries.Collect(ch)
	m.handler.Collect(ch)
	m.delay.Collect(ch)
	m.batch.Collect(ch)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.src == nil {
		return
	}
	paused := 0.0
	if !m.src.Stats().PausedSince.IsZero() {
		paused = 1
	}
	ch <- prometheus.MustNewConstMetric(m.paused, prometheus.GaugeValue, paused)
	if time.Since(m.readAt) >= m.opts.Refresh {
		ctx, cancel := context.WithTimeout(context.Background(), m.opts.QueryTimeout)
		m.counts, m.readErr = m.src.FailureCounts(ctx)
		cancel()
		m.readAt = time.Now()
	}
	if m.readErr != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(m.parked, prometheus.GaugeValue, float64(m.counts.Parked))
	ch <- prometheus.MustNewConstMetric(m.backlog, prometheus.GaugeValue, float64(m.counts.Retrying))
}

// Err returns the error of the last reading of the database figures, nil
// when it succeeded (or none was made yet).
func (m *Metrics) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.readErr
}
