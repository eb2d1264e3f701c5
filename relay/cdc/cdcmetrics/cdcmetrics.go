// Package cdcmetrics exports a log relay's statistics (package relay/cdc, or
// relay/binlog) to Prometheus.
//
//	m := cdcmetrics.New(slot)
//	cfg = m.Instrument(cfg) // sets cfg.Observer to feed the histograms
//	// (binlog.Config: cfg.Observer = m.Observer(cfg.Observer))
//	r, err := cdc.New(dbURL, pub, cfg)
//	...
//	m.Watch(r)
//	registry.MustRegister(m)
//
// Metrics (all prefixed idem_cdc_; label slot):
//
//	slot_lag_bytes                  gauge     WAL between the server's position and the slot's confirmed one
//	slot_retained_bytes             gauge     WAL the slot keeps on the server's disk (from its restart position)
//	lag_seconds                     gauge     age of the oldest commit read and not yet confirmed
//	streaming, waiting              gauge     1 while the relay reads the slot; 1 while another process holds it
//	inflight_messages               gauge     messages read, not yet confirmed by the broker
//	published_total                 counter   messages the broker confirmed (rate: the publish rate)
//	publish_calls_total             counter   Publish calls
//	publish_failures_total          counter   Publish calls that failed in whole or in part (retried)
//	transactions_total              counter   committed transactions read that held outbox events
//	unreadable_total                counter   rows and WAL messages that could not become messages
//	quarantined_total               counter   rows quarantined in the outbox table
//	deleted_total                   counter   published rows deleted
//	archived_total                  counter   events written into the archive (for idem replay)
//	archive_purged_total            counter   archived events deleted after the archive's retention
//	publish_duration_seconds        histogram one Publish call
//	commit_to_publish_seconds       histogram commit to the broker's confirmation
//	confirm_delay_seconds           histogram commit to its position confirmed to the server
//	stage_seconds{stage}            histogram commit_to_publish in parts (logrelay.Stages): receive (commit
//	                                          to read from the stream), visible (to seen visible), queue
//	                                          (to its Publish call), confirm (the call)
//
// The slot gauges are as fresh as cdc.Config.StandbyInterval; the others
// are read when Prometheus scrapes. Alert on slot_retained_bytes
// approaching max_slot_wal_keep_size (or the free disk), on lag_seconds
// above what the consumers can wait, and on streaming + waiting being 0 for
// a minute (no relay reads the slot).
package cdcmetrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/logrelay"
)

// StatsSource is what Metrics reads: *cdc.Relay and *binlog.Relay have
// it.
type StatsSource interface {
	Stats() logrelay.Stats
}

// Buckets returns the histograms' buckets, in seconds.
func Buckets() []float64 {
	return []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
}

// Metrics is a prometheus.Collector for one CDC relay.
type Metrics struct {
	publish, commitToPublish, confirm prometheus.Histogram
	stages                            *prometheus.HistogramVec
	descs                             map[string]*prometheus.Desc

	mu  sync.Mutex
	src StatsSource
}

// New returns the collector of the relay of slot (its const label slot;
// "" leaves it out).
func New(slot string) *Metrics {
	labels := prometheus.Labels{}
	if slot != "" {
		labels["slot"] = slot
	}
	h := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "idem", Subsystem: "cdc", Name: name, Help: help, Buckets: Buckets(), ConstLabels: labels})
	}
	m := &Metrics{
		publish:         h("publish_duration_seconds", "Duration of one Publish call."),
		commitToPublish: h("commit_to_publish_seconds", "Time from a transaction's commit to the broker's confirmation of its message."),
		confirm:         h("confirm_delay_seconds", "Time from a transaction's commit to its position confirmed to the server."),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "idem", Subsystem: "cdc", Name: "stage_seconds",
			Help:    "Parts of the time from a transaction's commit to the broker's confirmation of its message: receive, visible, queue, confirm.",
			Buckets: Buckets(), ConstLabels: labels}, []string{"stage"}),
		descs: map[string]*prometheus.Desc{},
	}
	for name, help := range map[string]string{
		"slot_lag_bytes":         "WAL bytes between the server's current position and the slot's confirmed position.",
		"slot_retained_bytes":    "WAL bytes the slot keeps on the server (from its restart position).",
		"lag_seconds":            "Age of the oldest commit read and not yet confirmed; 0 when none waits.",
		"streaming":              "1 while the relay reads the slot.",
		"waiting":                "1 while another process holds the slot and this relay waits to take over.",
		"inflight_messages":      "Messages read and not yet confirmed by the broker.",
		"published_total":        "Messages the broker confirmed.",
		"publish_calls_total":    "Publish calls.",
		"publish_failures_total": "Publish calls that failed in whole or in part (retried).",
		"transactions_total":     "Committed transactions read that held outbox events.",
		"unreadable_total":       "Rows and WAL messages that could not become messages.",
		"quarantined_total":      "Rows quarantined in the outbox table.",
		"deleted_total":          "Published rows deleted.",
		"archived_total":         "Events written into the outbox's archive, for idem replay.",
		"archive_purged_total":   "Archived events deleted after the archive's retention.",
	} {
		m.descs[name] = prometheus.NewDesc("idem_cdc_"+name, help, nil, labels)
	}
	return m
}

// Instrument returns cfg with its Observer's functions feeding the histograms
// (hooks already set are called too).
func (m *Metrics) Instrument(cfg cdc.Config) cdc.Config {
	cfg.Observer = m.Observer(cfg.Observer)
	return cfg
}

// Observer returns an observer feeding the histograms, which calls the
// hooks of prev too: binlog.Config's Observer, or any log relay's.
func (m *Metrics) Observer(prev logrelay.Observer) logrelay.Observer {
	var o logrelay.Observer
	prevPub, prevC2P, prevConf, prevStages := prev.Publish, prev.CommitToPublish, prev.Confirm, prev.Stages
	receive, visible := m.stages.WithLabelValues("receive"), m.stages.WithLabelValues("visible")
	queue, confirm := m.stages.WithLabelValues("queue"), m.stages.WithLabelValues("confirm")
	o.Publish = func(n int, d time.Duration, err error) {
		m.publish.Observe(d.Seconds())
		if prevPub != nil {
			prevPub(n, d, err)
		}
	}
	o.CommitToPublish = func(d time.Duration) {
		m.commitToPublish.Observe(d.Seconds())
		if prevC2P != nil {
			prevC2P(d)
		}
	}
	o.Confirm = func(d time.Duration) {
		m.confirm.Observe(d.Seconds())
		if prevConf != nil {
			prevConf(d)
		}
	}
	o.Stages = func(s logrelay.Stages) {
		receive.Observe(s.Receive.Seconds())
		visible.Observe(s.Visible.Seconds())
		queue.Observe(s.Queue.Seconds())
		confirm.Observe(s.Confirm.Seconds())
		if prevStages != nil {
			prevStages(s)
		}
	}
	return o
}

// Watch sets the relay whose Stats the gauges and counters read.
func (m *Metrics) Watch(src StatsSource) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.src = src
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range m.descs {
		ch <- d
	}
	m.publish.Describe(ch)
	m.commitToPublish.Describe(ch)
	m.confirm.Describe(ch)
	m.stages.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.publish.Collect(ch)
	m.commitToPublish.Collect(ch)
	m.confirm.Collect(ch)
	m.stages.Collect(ch)
	m.mu.Lock()
	src := m.src
	m.mu.Unlock()
	if src == nil {
		return
	}
	s := src.Stats()
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for name, v := range map[string]float64{
		"slot_lag_bytes":      float64(s.LagBytes),
		"slot_retained_bytes": float64(s.RetainedBytes),
		"lag_seconds":         s.Lag.Seconds(),
		"streaming":           b(s.Streaming),
		"waiting":             b(s.Waiting),
		"inflight_messages":   float64(s.InFlight),
	} {
		ch <- prometheus.MustNewConstMetric(m.descs[name], prometheus.GaugeValue, v)
	}
	for name, v := range map[string]int64{
		"published_total":        s.Published,
		"publish_calls_total":    s.PublishCalls,
		"publish_failures_total": s.PublishFailures,
		"transactions_total":     s.Transactions,
		"unreadable_total":       s.Unreadable,
		"quarantined_total":      s.Quarantined,
		"deleted_total":          s.Deleted,
		"archived_total":         s.Archived,
		"archive_purged_total":   s.ArchivePurged,
	} {
		ch <- prometheus.MustNewConstMetric(m.descs[name], prometheus.CounterValue, float64(v))
	}
}
