package dashboard

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idem-go/idem/monitor"
)

// commitToHandleMetric is the consumers' histogram of the delay from an
// event's occurred_at to the end of its handling.
const commitToHandleMetric = "idem_consumer_commit_to_handle_seconds"

// sample is the state of every database at one time, for the charts.
type sample struct {
	at  time.Time
	dbs map[string]dbSample
}

// dbSample is one database's figures in a sample.
type dbSample struct {
	ok          bool
	outbox      bool
	backlog     int64
	quarantined int64
	processed   int64 // in the minute before, every consumer together
	parked      int64
	consumers   map[string]consumerSample
	// p50 and p99 of the commit-to-handle delay over the sampling
	// interval, every consumer together; NaN when unknown.
	p50, p99 float64
}

// quantileWindow is how far back the overview's p50 and p99 go: the
// observations of the samples of the last five minutes (or History).
const quantileWindow = 5 * time.Minute

// consumerSample is one consumer's figures in a sample.
type consumerSample struct {
	processed int64
	parked    int64
	p50, p99  float64
	// h holds the commit-to-handle observations of the interval.
	h histogram
}

// history keeps the samples of the last Config.History.
type history struct {
	mu      sync.Mutex
	keep    time.Duration
	samples []sample
	// prev holds the last histogram read per consumer, to compute the
	// quantiles of the next interval from the difference.
	prev map[string]histogram
}

func (h *history) add(s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.samples = append(h.samples, s)
	cut := 0
	for cut < len(h.samples) && s.at.Sub(h.samples[cut].at) > h.keep {
		cut++
	}
	h.samples = slices.Delete(h.samples, 0, cut)
}

// snapshot returns a copy of the samples, oldest first.
func (h *history) snapshot() []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.samples)
}

// recentQuantiles returns a consumer's p50 and p99 over the samples of the
// last quantileWindow (NaN when none has observations).
func (h *history) recentQuantiles(db, consumer string) (p50, p99 float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var sum histogram
	if n := len(h.samples); n > 0 {
		from := h.samples[n-1].at.Add(-quantileWindow)
		for _, s := range h.samples {
			if s.at.After(from) {
				sum = sum.plus(s.dbs[db].consumers[consumer].h)
			}
		}
	}
	return sum.quantile(0.5), sum.quantile(0.99)
}

// run samples every interval until ctx ends.
func (d *Dashboard) run(ctx context.Context) {
	t := time.NewTicker(d.cfg.SampleInterval)
	defer t.Stop()
	for {
		d.sampleOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleOnce reads every database (and the gatherer) and records a sample.
func (d *Dashboard) sampleOnce(ctx context.Context) {
	s := sample{at: time.Now(), dbs: map[string]dbSample{}}
	snaps := d.snapshots(ctx)
	quantiles := d.quantiles()
	for i, db := range d.cfg.Databases {
		r := snaps[i]
		if r.err != nil {
			s.dbs[db.Name] = dbSample{p50: math.NaN(), p99: math.NaN()}
			continue
		}
		ds := dbSample{ok: true, outbox: r.snap.Outbox.Present, backlog: r.snap.Outbox.Backlog,
			quarantined: r.snap.Outbox.Quarantined, consumers: map[string]consumerSample{}}
		var sum histogram
		for _, c := range r.snap.Consumers {
			cs := consumerSample{processed: c.ProcessedLastMinute, parked: c.Parked, p50: math.NaN(), p99: math.NaN()}
			if q, ok := quantiles[c.Name]; ok {
				cs.p50, cs.p99, cs.h = q.quantile(0.5), q.quantile(0.99), q
				sum = sum.plus(q)
			}
			ds.processed += c.ProcessedLastMinute
			ds.parked += c.Parked
			ds.consumers[c.Name] = cs
		}
		ds.p50, ds.p99 = sum.quantile(0.5), sum.quantile(0.99)
		s.dbs[db.Name] = ds
	}
	if ctx.Err() == nil {
		d.hist.add(s)
	}
}

// snapResult is the snapshot of one database, or why there is none.
type snapResult struct {
	snap monitor.Snapshot
	err  error
}

// snapshots reads every database at once, each within QueryTimeout.
func (d *Dashboard) snapshots(ctx context.Context) []snapResult {
	out := make([]snapResult, len(d.cfg.Databases))
	var wg sync.WaitGroup
	for i, db := range d.cfg.Databases {
		wg.Go(func() {
			qctx, cancel := context.WithTimeout(ctx, d.cfg.QueryTimeout)
			defer cancel()
			snap, err := db.Source.Snapshot(qctx)
			out[i] = snapResult{snap: snap, err: err}
		})
	}
	wg.Wait()
	return out
}

// quantiles returns, per consumer, the commit-to-handle histogram of the
// interval since the previous call (the difference of the cumulative
// counts), when the gatherer has it.
func (d *Dashboard) quantiles() map[string]histogram {
	if d.cfg.Gatherer == nil {
		return nil
	}
	now := gatherHistograms(d.cfg.Gatherer, commitToHandleMetric, "consumer")
	d.hist.mu.Lock()
	prev := d.hist.prev
	d.hist.prev = now
	d.hist.mu.Unlock()
	if prev == nil {
		return nil
	}
	out := map[string]histogram{}
	for name, h := range now {
		if p, ok := prev[name]; ok {
			h = h.minus(p)
		}
		out[name] = h
	}
	return out
}

// histogram is a cumulative histogram: counts[i] observations at most
// bounds[i], and count in all (the rest above the last bound).
type histogram struct {
	bounds []float64
	counts []float64
	count  float64
}

// gatherHistograms reads the histograms named name from g, by the value of
// their label (summed over their other labels).
func gatherHistograms(g prometheus.Gatherer, name, label string) map[string]histogram {
	families, err := g.Gather()
	if err != nil && len(families) == 0 {
		return nil
	}
	out := map[string]histogram{}
	for _, f := range families {
		if f.GetName() != name || f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		for _, m := range f.GetMetric() {
			key := ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					key = lp.GetValue()
				}
			}
			ph := m.GetHistogram()
			h := histogram{count: float64(ph.GetSampleCount())}
			for _, b := range ph.GetBucket() {
				if math.IsInf(b.GetUpperBound(), 1) {
					continue
				}
				h.bounds = append(h.bounds, b.GetUpperBound())
				h.counts = append(h.counts, float64(b.GetCumulativeCount()))
			}
			out[key] = out[key].plus(h)
		}
	}
	return out
}

// plus adds two histograms with the same bounds; a zero histogram is the
// identity. Histograms with other bounds cannot be added: the result is
// unknown (a zero histogram with a count of -1).
func (h histogram) plus(o histogram) histogram {
	switch {
	case h.count < 0 || o.count < 0:
		return histogram{count: -1}
	case len(h.bounds) == 0 && h.count == 0:
		return o
	case len(o.bounds) == 0 && o.count == 0:
		return h
	case !slices.Equal(h.bounds, o.bounds):
		return histogram{count: -1}
	}
	out := histogram{bounds: h.bounds, counts: make([]float64, len(h.counts)), count: h.count + o.count}
	for i := range h.counts {
		out.counts[i] = h.counts[i] + o.counts[i]
	}
	return out
}

// minus returns the observations of h that are not in o, an earlier read
// of the same histogram (a histogram reset since then is taken whole).
func (h histogram) minus(o histogram) histogram {
	if !slices.Equal(h.bounds, o.bounds) || o.count > h.count {
		return h
	}
	out := histogram{bounds: h.bounds, counts: make([]float64, len(h.counts)), count: h.count - o.count}
	for i := range h.counts {
		out.counts[i] = h.counts[i] - o.counts[i]
	}
	return out
}

// quantile estimates the q-quantile as Prometheus' histogram_quantile does:
// linear interpolation inside the bucket holding the rank; the last finite
// bound when the rank falls above it. NaN without observations.
func (h histogram) quantile(q float64) float64 {
	if h.count <= 0 || len(h.bounds) == 0 {
		return math.NaN()
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, ub := range h.bounds {
		if h.counts[i] >= rank {
			in := h.counts[i] - below
			if in <= 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/in
		}
		lower, below = ub, h.counts[i]
	}
	return h.bounds[len(h.bounds)-1]
}
