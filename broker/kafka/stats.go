package kafka

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DelayBuckets returns the upper bounds of the commit-to-handle delay
// histogram in Stats.
func DelayBuckets() []time.Duration { return slices.Clone(delayBuckets) }

var delayBuckets = []time.Duration{
	time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute,
}

// Stats is a snapshot of a Subscriber's counters since it started.
type Stats struct {
	// Handled counts records the consumer applied, skipped as duplicates or
	// ignored.
	Handled uint64
	// Parked counts records the consumer parked in its failure store.
	Parked uint64
	// DeadLettered counts records sent to a dead-letter topic.
	DeadLettered uint64
	// Retries counts deliveries the consumer asked to retry.
	Retries uint64
	// Paused counts deliveries the consumer paused on (its database or a
	// dependency was away); the partition waited and tried them again.
	Paused uint64
	// Requeued counts deliveries that could be neither handled nor parked
	// (the database was unreachable) and were tried again.
	Requeued uint64
	// Commits and CommitErrors count offset commits.
	Commits, CommitErrors uint64
	// Delay is the histogram of the time from an event's occurrence (its
	// outbox commit) to the end of its handling.
	Delay DelayHistogram
	// Partitions has one entry per partition this subscriber committed
	// offsets for or holds, sorted by topic and partition.
	Partitions []PartitionStats
}

// DelayHistogram is a cumulative histogram over DelayBuckets().
type DelayHistogram struct {
	// Counts[i] counts delays at most DelayBuckets()[i]; the last entry counts
	// every observation (the +Inf bucket).
	Counts []uint64
	// Count is the number of observations and Sum their total.
	Count uint64
	Sum   time.Duration
}

// PartitionStats describes one partition.
type PartitionStats struct {
	Topic     string
	Partition int32
	// Committed is the last committed offset (the next record to read), -1
	// if this subscriber committed none.
	Committed int64
	// HighWatermark is the partition's end offset at the last fetch, -1 if
	// unknown.
	HighWatermark int64
	// Lag is HighWatermark - Committed when both are known, else -1.
	Lag int64
	// Buffered is how many fetched records wait to be handled.
	Buffered int
	// Assigned reports whether the partition is currently assigned to this
	// subscriber.
	Assigned bool
	// Failing reports that the partition waits on a record being retried.
	Failing bool
}

type subStats struct {
	handled, parked, deadLettered, retries, paused, requeued, commits, commitErrors atomic.Uint64
	delay                                                                           histogram

	mu        sync.Mutex
	committed map[tp]int64
	hwm       map[tp]int64
}

func (s *subStats) init() {
	s.committed = map[tp]int64{}
	s.hwm = map[tp]int64{}
	s.delay.counts = make([]atomic.Uint64, len(delayBuckets)+1)
}

func (s *subStats) committedAt(k tp, off int64) {
	s.mu.Lock()
	if off > s.committed[k] {
		s.committed[k] = off
	}
	s.mu.Unlock()
}

type histogram struct {
	counts []atomic.Uint64
	sum    atomic.Int64
}

func (h *histogram) observe(d time.Duration) {
	i, _ := slices.BinarySearch(delayBuckets, d)
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

func (h *histogram) snapshot() DelayHistogram {
	out := DelayHistogram{Counts: make([]uint64, len(h.counts)), Sum: time.Duration(h.sum.Load())}
	var cum uint64
	for i := range h.counts {
		cum += h.counts[i].Load()
		out.Counts[i] = cum
	}
	out.Count = cum
	return out
}

// Stats returns the subscriber's counters and per-partition lag.
func (s *Subscriber) Stats() Stats {
	st := Stats{
		Handled:      s.st.handled.Load(),
		Parked:       s.st.parked.Load(),
		DeadLettered: s.st.deadLettered.Load(),
		Retries:      s.st.retries.Load(),
		Paused:       s.st.paused.Load(),
		Requeued:     s.st.requeued.Load(),
		Commits:      s.st.commits.Load(),
		CommitErrors: s.st.commitErrors.Load(),
		Delay:        s.st.delay.snapshot(),
	}
	parts := map[tp]*PartitionStats{}
	get := func(k tp) *PartitionStats {
		p := parts[k]
		if p == nil {
			p = &PartitionStats{Topic: k.topic, Partition: k.partition, Committed: -1, HighWatermark: -1, Lag: -1}
			parts[k] = p
		}
		return p
	}
	s.st.mu.Lock()
	for k, off := range s.st.committed {
		get(k).Committed = off
	}
	for k, h := range s.st.hwm {
		get(k).HighWatermark = h
	}
	s.st.mu.Unlock()
	s.mu.Lock()
	for k, w := range s.workers {
		p := get(k)
		p.Assigned = true
		p.Buffered = w.buffered()
		p.Failing = w.failing.Load()
	}
	s.mu.Unlock()
	for _, p := range parts {
		if p.Committed >= 0 && p.HighWatermark >= 0 {
			p.Lag = max(0, p.HighWatermark-p.Committed)
		}
		st.Partitions = append(st.Partitions, *p)
	}
	slices.SortFunc(st.Partitions, func(a, b PartitionStats) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	return st
}
