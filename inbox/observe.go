package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// Observer is told what a consumer does, for metrics: package
// inbox/inboxmetrics makes one that feeds Prometheus. Set it as
// Config.Observer. The consumer calls its functions on the delivery path,
// from every worker at once: they must be fast and safe for concurrent use.
// A nil function is not called; the zero Observer costs nothing.
//
// What the consumer knows without being told (whether it is paused) is in
// Consumer.Stats, and what waits in its database (parked messages, the
// retry backlog) in Consumer.FailureCounts.
type Observer struct {
	// Batch is called once per DeliverBatch and ProcessBatch call, with
	// the number of deliveries (events) it was given.
	Batch func(size int)
	// Settled is called once per delivery that a DeliverBatch call
	// settled, and once per event of Process and ProcessBatch, with what
	// happened to it: the outcomes that Stats counts.
	Settled func(Settlement)
	// Handled is called each time the handlers of an event have run, with
	// how long they took: the handler chain, in the consumer's
	// transaction, without the commit. Handlers that failed are timed
	// too.
	Handled func(time.Duration)
}

// Settlement is what happened to one delivery, for Observer.Settled.
type Settlement struct {
	// Outcome is what the consumer did with it. Through DeliverBatch,
	// Failed means that it is to be retried (Action Retry).
	Outcome Outcome
	// Event is the delivery's event; zero when the delivery could not be
	// decoded.
	Event idem.Event
	// At is when its handling ended: after the commit of its transaction
	// when it was applied. At minus Event.OccurredAt is its
	// commit-to-handle delay.
	At time.Time
}

// observeBatch tells the observer the size of a batch.
func (c *Consumer[TTx]) observeBatch(n int) {
	if f := c.cfg.Observer.Batch; f != nil {
		f(n)
	}
}

// countDispositions counts each disposition in Stats and tells the
// observer.
func (c *Consumer[TTx]) countDispositions(disps []Disposition) {
	f := c.cfg.Observer.Settled
	var now time.Time
	if f != nil {
		now = time.Now()
	}
	for _, d := range disps {
		c.stats.count(d.Outcome)
		if f != nil {
			f(Settlement{Outcome: d.Outcome, Event: d.Event, At: now})
		}
	}
}

// countResults counts the results of events in Stats and tells the
// observer.
func (c *Consumer[TTx]) countResults(events []idem.Event, results []Result) {
	f := c.cfg.Observer.Settled
	var now time.Time
	if f != nil {
		now = time.Now()
	}
	for i, r := range results {
		c.stats.count(r.Outcome)
		if f != nil {
			f(Settlement{Outcome: r.Outcome, Event: events[i], At: now})
		}
	}
}

// timeHandlers starts timing a handler chain; call what it returns when
// the chain has run.
func (c *Consumer[TTx]) timeHandlers() func() {
	f := c.cfg.Observer.Handled
	if f == nil {
		return noop
	}
	start := time.Now()
	return func() { f(time.Since(start)) }
}

func noop() {}

// FailureCounts counts, in the consumer's database, its parked messages
// and the events it is retrying (see driver.ConsumerCounts): one query, two
// index range scans on the consumer's name.
func (c *Consumer[TTx]) FailureCounts(ctx context.Context) (driver.ConsumerCounts, error) {
	n, err := c.drv.Dialect().ConsumerCounts(ctx, c.drv.Pool(), c.cfg.Name)
	if err != nil {
		return n, fmt.Errorf("idem: inbox %s: count parked and retried messages: %w", c.cfg.Name, err)
	}
	return n, nil
}
