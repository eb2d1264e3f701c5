// Package kafkametrics exports a Kafka Subscriber's Stats to Prometheus:
//
//	prometheus.MustRegister(kafkametrics.NewCollector(sub, "shipping"))
//
// Metrics (label group on each, topic and partition on the per-partition
// ones):
//
//	idem_kafka_consumer_lag                      gauge, per partition
//	idem_kafka_committed_offset                  gauge, per partition
//	idem_kafka_handled_total                     counter
//	idem_kafka_retries_total                     counter
//	idem_kafka_paused_total                      counter
//	idem_kafka_parked_total                      counter
//	idem_kafka_dead_lettered_total               counter
//	idem_kafka_requeued_total                    counter
//	idem_kafka_commits_total                     counter
//	idem_kafka_commit_errors_total               counter
//	idem_kafka_handle_delay_seconds              histogram: event occurrence to end of handling
//
// The consumer itself has metrics on every transport (inbox/inboxmetrics:
// idem_consumer_* by outcome, handler durations, commit-to-handle delay,
// parked messages, retry backlog, paused state); these add what only Kafka
// tells: the lag and committed offset of each partition, and the
// subscriber's own counters (dead letters, offset commits). Alert on a lag
// that keeps growing. docs/OPERATIONS.md lists every metric of idem and the
// alerts to set.
package kafkametrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem/broker/kafka"
)

// Source is what the collector reads: a *kafka.Subscriber.
type Source interface {
	Stats() kafka.Stats
}

// Collector is a prometheus.Collector over a subscriber's Stats.
type Collector struct {
	src   Source
	group string

	lag, committed                                                          *prometheus.Desc
	handled, retries, paused, parked, deadLettered, requeued, commits, cErr *prometheus.Desc
	delay                                                                   *prometheus.Desc
}

// NewCollector returns a collector of src's metrics, labelled with group.
func NewCollector(src Source, group string) *Collector {
	cl := prometheus.Labels{"group": group}
	part := []string{"topic", "partition"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("idem_kafka_"+name, help, labels, cl)
	}
	return &Collector{
		src:          src,
		group:        group,
		lag:          d("consumer_lag", "Records between the committed offset and the partition's end.", part),
		committed:    d("committed_offset", "Last committed offset of the partition.", part),
		handled:      d("handled_total", "Records applied, skipped as duplicates or ignored.", nil),
		retries:      d("retries_total", "Deliveries the consumer asked to retry.", nil),
		paused:       d("paused_total", "Deliveries the consumer paused on (its database or a dependency was away).", nil),
		parked:       d("parked_total", "Records parked in the failure store.", nil),
		deadLettered: d("dead_lettered_total", "Records sent to a dead-letter topic.", nil),
		requeued:     d("requeued_total", "Deliveries neither handled nor parked, tried again.", nil),
		commits:      d("commits_total", "Successful offset commits.", nil),
		cErr:         d("commit_errors_total", "Failed offset commits.", nil),
		delay:        d("handle_delay_seconds", "Delay from an event's occurrence to the end of its handling.", nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lag, c.committed, c.handled, c.retries, c.paused, c.parked, c.deadLettered, c.requeued, c.commits, c.cErr, c.delay} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Stats()
	for _, p := range st.Partitions {
		part := strconv.Itoa(int(p.Partition))
		if p.Lag >= 0 {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(p.Lag), p.Topic, part)
		}
		if p.Committed >= 0 {
			ch <- prometheus.MustNewConstMetric(c.committed, prometheus.GaugeValue, float64(p.Committed), p.Topic, part)
		}
	}
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(c.handled, st.Handled)
	counter(c.retries, st.Retries)
	counter(c.paused, st.Paused)
	counter(c.parked, st.Parked)
	counter(c.deadLettered, st.DeadLettered)
	counter(c.requeued, st.Requeued)
	counter(c.commits, st.Commits)
	counter(c.cErr, st.CommitErrors)
	bounds := kafka.DelayBuckets()
	buckets := make(map[float64]uint64, len(bounds))
	for i, b := range bounds {
		buckets[b.Seconds()] = st.Delay.Counts[i]
	}
	ch <- prometheus.MustNewConstHistogram(c.delay, st.Delay.Count, st.Delay.Sum.Seconds(), buckets)
}
