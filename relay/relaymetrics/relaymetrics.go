// Package relaymetrics exports a relay's statistics to Prometheus.
//
//	m := relaymetrics.New()
//	cfg = m.Instrument(cfg) // sets cfg.Observer to feed the histograms
//	r, err := relay.New(drv, pub, cfg)
//	...
//	m.Watch(r)
//	registry.MustRegister(m)
//
// Several relays (one per outbox table) share a registry when each has its
// own const label: relaymetrics.NewWith(relaymetrics.Options{Table: "order"})
// labels every metric table="order".
//
// Metrics (all prefixed idem_relay_):
//
//	backlog_rows                        gauge     unpublished outbox rows, quarantined ones excluded
//	quarantined_rows                    gauge     quarantined outbox rows (see "idem failed list --relay")
//	scheduled_rows                      gauge     delayed rows not due yet (not in backlog_rows)
//	oldest_unpublished_age_seconds      gauge     age of the oldest unpublished row
//	published_total                     counter   rows confirmed by the broker and marked
//	publish_errors_total                counter   rows whose publication failed
//	quarantined_total                   counter   rows this relay quarantined
//	lease_takeovers_total               counter   rows claimed from an expired lease
//	leases_lost_total                   counter   confirmed rows this relay could not mark (taken over)
//	claims_total, claimed_rows_total    counter   claims that returned rows, and their rows
//	empty_claims_total                  counter   claims that found nothing
//	wakeups_total                       counter   wake-ups by notifications and Notify
//	released_total, deleted_total       counter   rows released unpublished; published rows deleted
//	broker_paused                       gauge     1 while the relay waits for a failing broker
//	inflight_publishes                  gauge     messages handed to the broker, not yet confirmed or refused
//	commit_to_publish_seconds           histogram insertion to broker confirm
//	claim_duration_seconds              histogram one claim (empty ones included)
//	publish_duration_seconds            histogram one Publish call (one round of a batch)
//	mark_duration_seconds               histogram marking a batch's confirmed rows published
//
// The backlog gauges are as fresh as relay.Config.StatsInterval; the
// others are read when Prometheus scrapes. Alert on quarantined_rows above
// zero (each quarantined row holds the later rows of its aggregate back
// until an operator re-drives or removes it), on
// oldest_unpublished_age_seconds above what the consumers can wait, and on
// broker_paused staying 1. docs/OPERATIONS.md lists every metric of idem
// and the alerts to set.
package relaymetrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem/relay"
)

// StatsSource is what Metrics reads: *relay.Relay has it.
type StatsSource interface {
	Stats() relay.Stats
}

// DelayBuckets returns the commit-to-publish histogram's buckets, in
// seconds.
func DelayBuckets() []float64 {
	return []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
}

// DurationBuckets returns the buckets of the claim, publish and mark
// histograms, in seconds.
func DurationBuckets() []float64 {
	return []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
}

// Options configures Metrics. The zero value is valid.
type Options struct {
	// Table, when set, labels every metric table="<Table>", so that the
	// relays of several outbox tables can share a registry.
	Table string
	// ConstLabels are more labels set on every metric.
	ConstLabels prometheus.Labels
}

// Metrics is a prometheus.Collector for one relay.
type Metrics struct {
	delay                prometheus.Histogram
	claim, publish, mark prometheus.Histogram
	inFlight             *prometheus.Desc

	mu  sync.Mutex
	src StatsSource

	backlog, oldest, paused, inQuarantine     *prometheus.Desc
	scheduled                                 *prometheus.Desc
	published, publishErrors, takeovers, lost *prometheus.Desc
	claims, claimed, released, deleted        *prometheus.Desc
	emptyClaims, wakeups                      *prometheus.Desc
	quarantined                               *prometheus.Desc
}

var _ prometheus.Collector = (*Metrics)(nil)

// New returns metrics with no relay to watch yet, without labels.
func New() *Metrics { return NewWith(Options{}) }

// NewWith returns metrics with no relay to watch yet, labelled as o says.
func NewWith(o Options) *Metrics {
	var cl prometheus.Labels
	if o.Table != "" || len(o.ConstLabels) > 0 {
		cl = prometheus.Labels{}
		for k, v := range o.ConstLabels {
			cl[k] = v
		}
		if o.Table != "" {
			cl["table"] = o.Table
		}
	}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("idem_relay_"+name, help, nil, cl)
	}
	h := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "idem_relay_" + name, Help: help, Buckets: buckets, ConstLabels: cl})
	}
	return &Metrics{
		delay: h("commit_to_publish_seconds",
			"Time from the insertion of an outbox row (start of its transaction) to the broker's confirm.", DelayBuckets()),
		claim: h("claim_duration_seconds",
			"Time of one claim of outbox rows (its transaction or statement), claims that find nothing included.", DurationBuckets()),
		publish: h("publish_duration_seconds",
			"Time of one Publish call: one round of a batch, until the broker confirmed or refused every message.", DurationBuckets()),
		mark: h("mark_duration_seconds",
			"Time to mark a batch's confirmed rows published, retries included.", DurationBuckets()),
		inFlight:      d("inflight_publishes", "Messages handed to the broker whose Publish call has not returned."),
		backlog:       d("backlog_rows", "Unpublished outbox rows, quarantined ones excluded."),
		scheduled:     d("scheduled_rows", "Delayed outbox rows (idem.Event.NotBefore) not due yet; backlog_rows leaves them out."),
		inQuarantine:  d("quarantined_rows", "Quarantined outbox rows: unpublished, holding the later rows of their aggregates back until re-driven or removed."),
		quarantined:   d("quarantined_total", "Rows this relay quarantined: unreadable, or refused by the broker on every allowed attempt."),
		oldest:        d("oldest_unpublished_age_seconds", "Age of the oldest unpublished outbox row (0 when none)."),
		paused:        d("broker_paused", "1 while the relay waits before trying a failing broker again."),
		published:     d("published_total", "Rows confirmed by the broker and marked published."),
		publishErrors: d("publish_errors_total", "Rows whose publication failed; they are retried."),
		takeovers:     d("lease_takeovers_total", "Rows claimed from another worker whose lease had expired."),
		lost:          d("leases_lost_total", "Confirmed rows this relay could not mark because another worker had taken them over."),
		claims:        d("claims_total", "Claims that returned rows."),
		claimed:       d("claimed_rows_total", "Rows returned by claims."),
		emptyClaims:   d("empty_claims_total", "Claims that found nothing."),
		wakeups:       d("wakeups_total", "Wake-ups from outside: notifications from the database, Relay.Notify."),
		released:      d("released_total", "Rows released unpublished."),
		deleted:       d("deleted_total", "Published rows deleted after the retention."),
	}
}

// ObserveDelay records one commit-to-publish delay (relay.Observer.Delay).
func (m *Metrics) ObserveDelay(d time.Duration) { m.delay.Observe(d.Seconds()) }

// Observer returns a relay.Observer that feeds m's histograms.
func (m *Metrics) Observer() relay.Observer {
	return relay.Observer{
		Delay:   m.ObserveDelay,
		Claim:   func(d time.Duration) { m.claim.Observe(d.Seconds()) },
		Publish: func(d time.Duration) { m.publish.Observe(d.Seconds()) },
		Mark:    func(d time.Duration) { m.mark.Observe(d.Seconds()) },
	}
}

// Instrument returns cfg with its Observer set to feed m's histograms.
func (m *Metrics) Instrument(cfg relay.Config) relay.Config {
	cfg.Observer = m.Observer()
	return cfg
}

// Watch sets the relay whose Stats are exported.
func (m *Metrics) Watch(src StatsSource) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.src = src
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, h := range []prometheus.Histogram{m.delay, m.claim, m.publish, m.mark} {
		h.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{m.inFlight, m.backlog, m.oldest, m.paused, m.inQuarantine, m.scheduled, m.published, m.publishErrors,
		m.takeovers, m.lost, m.claims, m.claimed, m.released, m.deleted, m.quarantined, m.emptyClaims, m.wakeups} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, h := range []prometheus.Histogram{m.delay, m.claim, m.publish, m.mark} {
		h.Collect(ch)
	}
	m.mu.Lock()
	src := m.src
	m.mu.Unlock()
	if src == nil {
		return
	}
	s := src.Stats()
	var age, paused float64
	if !s.OldestUnpublished.IsZero() {
		age = max(0, time.Since(s.OldestUnpublished).Seconds())
	}
	if !s.BrokerPausedUntil.IsZero() {
		paused = 1
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(m.inFlight, float64(s.InFlight))
	gauge(m.backlog, float64(s.Backlog))
	gauge(m.oldest, age)
	gauge(m.paused, paused)
	gauge(m.inQuarantine, float64(s.QuarantinedRows))
	gauge(m.scheduled, float64(s.Scheduled))
	counter(m.published, s.Published)
	counter(m.publishErrors, s.PublishErrors)
	counter(m.takeovers, s.Takeovers)
	counter(m.lost, s.LeasesLost)
	counter(m.claims, s.Claims)
	counter(m.claimed, s.Claimed)
	counter(m.emptyClaims, s.EmptyClaims)
	counter(m.wakeups, s.Wakeups)
	counter(m.released, s.Released)
	counter(m.deleted, s.Deleted)
	counter(m.quarantined, s.Quarantined)
}
