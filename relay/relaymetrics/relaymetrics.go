// Package relaymetrics exports a relay's statistics to Prometheus.
//
//	m := relaymetrics.New()
//	cfg.ObserveDelay = m.ObserveDelay // feeds the commit-to-publish histogram
//	r, err := relay.New(drv, pub, cfg)
//	...
//	m.Watch(r)
//	registry.MustRegister(m)
//
// Metrics (all prefixed idem_relay_):
//
//	backlog_rows                        gauge     unpublished outbox rows, quarantined ones excluded
//	quarantined_rows                    gauge     quarantined outbox rows (see "idem failed list --relay")
//	oldest_unpublished_age_seconds      gauge     age of the oldest unpublished row
//	published_total                     counter   rows confirmed by the broker and marked
//	publish_errors_total                counter   rows whose publication failed
//	quarantined_total                   counter   rows this relay quarantined
//	lease_takeovers_total               counter   rows claimed from an expired lease
//	leases_lost_total                   counter   confirmed rows this relay could not mark (taken over)
//	claims_total, claimed_rows_total    counter   claims that returned rows, and their rows
//	released_total, deleted_total       counter   rows released unpublished; published rows deleted
//	broker_paused                       gauge     1 while the relay waits for a failing broker
//	commit_to_publish_seconds           histogram insertion to broker confirm
//
// The backlog gauges are as fresh as relay.Config.StatsInterval. Alert on
// quarantined_rows above zero: each quarantined row holds the later rows of
// its aggregate back until an operator re-drives or removes it.
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

// DelayBuckets are the commit-to-publish histogram's buckets, in seconds.
var DelayBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// Metrics is a prometheus.Collector for one relay.
type Metrics struct {
	delay prometheus.Histogram

	mu  sync.Mutex
	src StatsSource

	backlog, oldest, paused, inQuarantine     *prometheus.Desc
	published, publishErrors, takeovers, lost *prometheus.Desc
	claims, claimed, released, deleted        *prometheus.Desc
	quarantined                               *prometheus.Desc
}

var _ prometheus.Collector = (*Metrics)(nil)

// New returns metrics with no relay to watch yet.
func New() *Metrics {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("idem_relay_"+name, help, nil, nil)
	}
	return &Metrics{
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idem_relay_commit_to_publish_seconds",
			Help:    "Time from the insertion of an outbox row (start of its transaction) to the broker's confirm.",
			Buckets: DelayBuckets,
		}),
		backlog:       d("backlog_rows", "Unpublished outbox rows, quarantined ones excluded."),
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
		released:      d("released_total", "Rows released unpublished."),
		deleted:       d("deleted_total", "Published rows deleted after the retention."),
	}
}

// ObserveDelay records one commit-to-publish delay; set it as
// relay.Config.ObserveDelay.
func (m *Metrics) ObserveDelay(d time.Duration) { m.delay.Observe(d.Seconds()) }

// Watch sets the relay whose Stats are exported.
func (m *Metrics) Watch(src StatsSource) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.src = src
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.delay.Describe(ch)
	for _, d := range []*prometheus.Desc{m.backlog, m.oldest, m.paused, m.inQuarantine, m.published, m.publishErrors,
		m.takeovers, m.lost, m.claims, m.claimed, m.released, m.deleted, m.quarantined} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.delay.Collect(ch)
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
	gauge(m.backlog, float64(s.Backlog))
	gauge(m.oldest, age)
	gauge(m.paused, paused)
	gauge(m.inQuarantine, float64(s.QuarantinedRows))
	counter(m.published, s.Published)
	counter(m.publishErrors, s.PublishErrors)
	counter(m.takeovers, s.Takeovers)
	counter(m.lost, s.LeasesLost)
	counter(m.claims, s.Claims)
	counter(m.claimed, s.Claimed)
	counter(m.released, s.Released)
	counter(m.deleted, s.Deleted)
	counter(m.quarantined, s.Quarantined)
}
