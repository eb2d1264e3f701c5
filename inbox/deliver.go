package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// Delivery is a message as a transport received it.
type Delivery struct {
	// Message is the message exactly as received.
	Message idem.Message
	// Source names where it came from: queue, topic/partition or subject.
	Source string
	// Attempt is the delivery attempt, from 1, as counted by the transport
	// (a header it carries, or the broker's delivery count).
	Attempt int
}

// Action tells a transport what to do with a delivery.
type Action int

// Actions.
const (
	// Ack: the message is done (applied, duplicate, ignored, or parked in the
	// failure store). Acknowledge it or commit past it.
	Ack Action = iota + 1
	// Retry: keep the message unacknowledged and deliver it again after
	// Disposition.RetryAfter. Until then, later messages of its aggregate
	// wait behind it (deliver them with it, after it, in order); other
	// messages go on.
	Retry
	// Pause: the consumer cannot work for now (its database or a dependency
	// is away: a transient failure). Keep the message unacknowledged, take no
	// new message until Disposition.RetryAfter has passed, then deliver it
	// again. A pause costs no attempt.
	Pause
)

// String returns the action in lower case ("ack", "retry", "pause").
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Pause:
		return "pause"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Disposition is the consumer's verdict on a delivery.
type Disposition struct {
	Action  Action
	Outcome Outcome
	// RetryAfter is how long to wait before delivering the message again
	// (Retry and Pause).
	RetryAfter time.Duration
	// Attempts is the number of failed attempts of the event counted so far
	// by the consumer (in its database, so it survives restarts and
	// rebalances); 0 when none failed or the count is unknown.
	Attempts int
	// Err is the decoding or handling error, if any.
	Err error
	// Event is the decoded event (zero if undecodable).
	Event idem.Event
}

// Deliver decodes d, processes it, and decides what the transport does next:
// Ack when it is applied, a duplicate, ignored or parked; Retry with a delay
// from the retry policy when a handler failed and retries remain. An
// undecodable message, a permanent error (idem.Permanent) or the last failed
// attempt is parked in the failure store with the raw message, then acked.
//
// A non-nil error means the message could not be parked either (the failure
// store is unreachable): the transport must not acknowledge it and should
// redeliver it later.
func (c *Consumer[TTx]) Deliver(ctx context.Context, d Delivery) (Disposition, error) {
	ev, err := c.cfg.Decoder.Decode(d.Message)
	if err != nil {
		return c.park(ctx, d, ev, err)
	}
	o, err := c.Process(ctx, ev)
	return c.settle(ctx, d, ev, o, err)
}

// DeliverBatch is Deliver for many deliveries, processed with ProcessBatch in
// one transaction. The i-th disposition is for deliveries[i]. A non-nil error
// at index i means that delivery could not be parked (see Deliver).
func (c *Consumer[TTx]) DeliverBatch(ctx context.Context, ds []Delivery) ([]Disposition, []error) {
	disps := make([]Disposition, len(ds))
	errs := make([]error, len(ds))
	events := make([]idem.Event, 0, len(ds))
	idx := make([]int, 0, len(ds))
	for i, d := range ds {
		ev, err := c.cfg.Decoder.Decode(d.Message)
		if err != nil {
			disps[i], errs[i] = c.park(ctx, d, ev, err)
			continue
		}
		events = append(events, ev)
		idx = append(idx, i)
	}
	results := c.ProcessBatch(ctx, events)
	for k, r := range results {
		i := idx[k]
		disps[i], errs[i] = c.settle(ctx, ds[i], events[k], r.Outcome, r.Err)
	}
	return disps, errs
}

func (c *Consumer[TTx]) settle(ctx context.Context, d Delivery, ev idem.Event, o Outcome, err error) (Disposition, error) {
	if err == nil {
		return Disposition{Action: Ack, Outcome: o, Event: ev}, nil
	}
	attempt := max(d.Attempt, 1)
	if !idem.IsPermanent(err) && c.cfg.Retry.Retry(attempt) && ctx.Err() == nil {
		return Disposition{Action: Retry, Outcome: Failed, RetryAfter: c.cfg.Retry.Delay(attempt), Err: err, Event: ev}, nil
	}
	if ctx.Err() != nil && !idem.IsPermanent(err) {
		// Shutting down: do not park an event that failed because of it.
		return Disposition{Action: Retry, Outcome: Failed, Err: err, Event: ev}, nil
	}
	return c.park(ctx, d, ev, err)
}

func (c *Consumer[TTx]) park(ctx context.Context, d Delivery, ev idem.Event, cause error) (Disposition, error) {
	m := driver.FailedMessage{
		Consumer:  c.cfg.Name,
		Source:    d.Source,
		EventID:   ev.ID,
		EventName: ev.Name,
		Key:       d.Message.Key,
		Headers:   d.Message.Headers,
		Body:      d.Message.Body,
		Error:     cause.Error(),
		Attempts:  max(d.Attempt, 1),
	}
	if m.EventID == [16]byte{} {
		m.EventID = d.Message.EventID
	}
	if m.EventName == "" {
		m.EventName = d.Message.EventName
	}
	id, err := c.failures.Save(context.WithoutCancel(ctx), m)
	if err != nil {
		return Disposition{Action: Retry, Outcome: Failed, Err: cause, Event: ev},
			fmt.Errorf("idem: inbox %s: park message in failure store: %w (message error: %v)", c.cfg.Name, err, cause)
	}
	c.stats.count(Parked)
	level := "handler failed"
	if errors.Is(cause, idem.ErrUndecodable) {
		level = "undecodable"
	}
	c.log.Warn("message parked in failure store", "reason", level, "failed_message_id", id,
		"event_id", m.EventID, "event_name", m.EventName, "source", d.Source, "attempts", m.Attempts, "error", cause)
	return Disposition{Action: Ack, Outcome: Parked, Err: cause, Event: ev}, nil
}
