package idemtest

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
)

// SourceDefault is the Source of the deliveries a Consumer makes: the queue
// the failure store records for a parked message.
const SourceDefault = "idemtest"

// settleMax bounds the deliveries Settle makes of one message.
const settleMax = 10_000

// Consumer is a real inbox.Consumer, with its handlers, its database and
// its failure model, driven as a transport drives it but one delivery at a
// time, in the test's goroutine, on a Clock: a retry's delay or a pause
// passes when the test says so (Settle advances the clock by it). Register
// handlers on it as on any consumer (c.Handle, inbox.HandleJSON(c.Consumer,
// ...)).
type Consumer[TTx any] struct {
	*inbox.Consumer[TTx]
	// Clock is the consumer's clock (inbox.Config.Now).
	Clock *Clock

	t testing.TB
}

// NewConsumer returns a consumer on drv, named cfg.Name ("test" when
// empty), for t. Its clock (cfg.Now) is Consumer.Clock, a new Clock
// standing at the current time: move it with Advance or Set. It logs to t
// (Logger) unless cfg.Logger is set. Every other field of cfg (Retry,
// OutageBudget, Parked...) is the application's to set, as in production.
func NewConsumer[TTx any](t testing.TB, drv driver.Driver[TTx], cfg inbox.Config) *Consumer[TTx] {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	clock := NewClock()
	cfg.Now = clock.Now
	if cfg.Logger == nil {
		cfg.Logger = Logger(t)
	}
	c, err := inbox.New(drv, cfg)
	if err != nil {
		t.Fatalf("idemtest: %v", err)
	}
	return &Consumer[TTx]{Consumer: c, Clock: clock, t: t}
}

// WithT returns c reporting its failures to t: the same consumer and
// clock, for a subtest (t.Run) of the test that made it.
func (c *Consumer[TTx]) WithT(t testing.TB) *Consumer[TTx] {
	cp := *c
	cp.t = t
	return &cp
}

// Message returns the message the relay publishes for ev (idem.NewMessage),
// or fails the test.
func Message(t testing.TB, ev idem.Event) idem.Message {
	t.Helper()
	m, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatalf("idemtest: encode event %s: %v", ev.Name, err)
	}
	return m
}

// Deliver delivers ev once, as the relay publishes it and a transport
// receives it, and returns the consumer's verdict: Outcome Applied,
// Duplicate, Ignored, Parked, Paused or Failed (to be retried after
// RetryAfter), with the error and the attempts counted. It fails the test
// when the consumer can neither handle nor park the message (DeliverBatch's
// error). It stands for inbox.Consumer's Deliver, still there as
// c.Consumer.Deliver(ctx, delivery).
func (c *Consumer[TTx]) Deliver(ev idem.Event) inbox.Disposition {
	c.t.Helper()
	return c.DeliverMessage(Message(c.t, ev))
}

// DeliverMessage delivers msg once, as it is: for bodies the relay would
// never publish (not JSON, another producer's envelope).
func (c *Consumer[TTx]) DeliverMessage(msg idem.Message) inbox.Disposition {
	c.t.Helper()
	ctx, cancel := ctx()
	defer cancel()
	disps, errs := c.DeliverBatch(ctx, []inbox.Delivery{{Message: msg, Source: SourceDefault, Attempt: 1}})
	if errs[0] != nil {
		c.t.Fatalf("idemtest: consumer %s could neither handle nor park message %s: %v", c.Name(), msg.EventID, errs[0])
	}
	return disps[0]
}

// Redrive delivers the parked message m again as "idem failed retry" sends
// it (inbox.Redrive): its bytes as stored, marked with idem.HeaderRedrive,
// to this consumer. Once it is applied (or found applied already) the
// consumer removes its entry from the failure store; if it fails again, it
// is parked again in the same entry. It returns the consumer's verdict.
func (c *Consumer[TTx]) Redrive(m idem.FailedMessage) inbox.Disposition {
	c.t.Helper()
	headers := make(map[string]string, len(m.Headers)+1)
	maps.Copy(headers, m.Headers)
	headers[idem.HeaderRedrive] = strconv.FormatInt(m.ID, 10)
	return c.DeliverMessage(idem.Message{EventID: m.EventID, EventName: m.EventName, Key: m.Key, Headers: headers, Body: m.Body})
}

// Settle delivers ev as a transport would until the consumer acknowledges
// it: after a Retry or a Pause, it moves the clock by the delay asked and
// delivers again. It returns every verdict, the last one an Ack (Applied,
// Duplicate, Ignored or Parked). An ordinary handler error is retried by the
// consumer's retry policy, then parked; a transient one pauses until the
// consumer's OutageBudget has passed on the clock, then counts as
// ordinary; a permanent one is parked at once.
func (c *Consumer[TTx]) Settle(ev idem.Event) []inbox.Disposition {
	c.t.Helper()
	msg := Message(c.t, ev)
	var out []inbox.Disposition
	for range settleMax {
		d := c.DeliverMessage(msg)
		out = append(out, d)
		if d.Action == inbox.Ack {
			return out
		}
		c.Clock.Advance(max(d.RetryAfter, time.Millisecond))
	}
	c.t.Fatalf("idemtest: event %s %s not settled after %d deliveries; the last: %s", ev.Name, ev.ID, settleMax, verdict(out[len(out)-1]))
	return out
}

// RequireOutcome delivers ev once and fails the test unless the consumer's
// outcome is want. It returns the verdict.
func (c *Consumer[TTx]) RequireOutcome(ev idem.Event, want inbox.Outcome) inbox.Disposition {
	c.t.Helper()
	d := c.Deliver(ev)
	if d.Outcome != want {
		c.t.Fatalf("idemtest: consumer %s: event %s %s was %s, want %s", c.Name(), ev.Name, ev.ID, verdict(d), want)
	}
	return d
}

// RequireAppliedOnce delivers ev twice, as a broker that delivers it again
// would, and fails the test unless the first delivery applies it and the
// second is a duplicate that runs no handler. The effects are the test's to
// check: they must be there once.
func (c *Consumer[TTx]) RequireAppliedOnce(ev idem.Event) {
	c.t.Helper()
	first, second := c.Deliver(ev), c.Deliver(ev)
	if first.Outcome != inbox.Applied || second.Outcome != inbox.Duplicate {
		c.t.Fatalf("idemtest: consumer %s: event %s %s delivered twice was %s, then %s; want applied, then duplicate",
			c.Name(), ev.Name, ev.ID, verdict(first), verdict(second))
	}
}

// Parked returns the consumer's parked messages (its failure store),
// oldest first, or fails the test.
func (c *Consumer[TTx]) Parked() []idem.FailedMessage {
	c.t.Helper()
	ctx, cancel := ctx()
	defer cancel()
	fm, err := c.Failures().List(ctx, idem.FailedFilter{Consumer: c.Name(), Oldest: true})
	if err != nil {
		c.t.Fatalf("idemtest: list consumer %s's failure store: %v", c.Name(), err)
	}
	return fm
}

// RequireParked fails the test unless ev is parked in the consumer's
// failure store, and returns its entry: the error, the attempts, the
// message byte for byte.
func (c *Consumer[TTx]) RequireParked(ev idem.Event) idem.FailedMessage {
	c.t.Helper()
	parked := c.Parked()
	for _, m := range parked {
		if m.EventID == ev.ID {
			return m
		}
	}
	c.t.Fatalf("idemtest: consumer %s has not parked event %s %s.\n%s", c.Name(), ev.Name, ev.ID, parkedListing(parked))
	return idem.FailedMessage{}
}

// RequireNoneParked fails the test if the consumer's failure store holds
// a message, and lists them.
func (c *Consumer[TTx]) RequireNoneParked() {
	c.t.Helper()
	if parked := c.Parked(); len(parked) > 0 {
		c.t.Fatalf("idemtest: consumer %s has parked messages, want none.\n%s", c.Name(), parkedListing(parked))
	}
}

// verdict is a disposition in a few words.
func verdict(d inbox.Disposition) string {
	s := d.Outcome.String()
	if d.Action != inbox.Ack {
		s += fmt.Sprintf(" (%s after %v)", d.Action, d.RetryAfter)
	}
	if d.Attempts > 0 {
		s += fmt.Sprintf(" after %d attempt(s)", d.Attempts)
	}
	if d.Err != nil {
		s += ": " + d.Err.Error()
	}
	return s
}

func parkedListing(parked []idem.FailedMessage) string {
	if len(parked) == 0 {
		return "Its failure store is empty."
	}
	lines := make([]string, len(parked))
	for i, m := range parked {
		lines[i] = fmt.Sprintf("#%d %s %s of %s %s, %d attempt(s): %s", m.ID, m.EventName, m.EventID, m.AggregateType, m.AggregateID, m.Attempts, m.Error)
	}
	return fmt.Sprintf("Its failure store holds %d message(s):\n  %s", len(parked), strings.Join(lines, "\n  "))
}
