// Package brokertest is the conformance suite of idem's transports. A
// transport (broker/amqp, broker/kafka, broker/nats) passes it or is not
// done:
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, brokertest.Transport{
//			New:      func(t *testing.T, o brokertest.Options) brokertest.Instance { ... },
//			Features: brokertest.Features{Restart: restartBroker},
//		})
//	}
//
// The suite talks to a transport through the two seams idem uses: a
// broker.Publisher, and a subscriber feeding deliveries to a DeliverFunc with
// the signature of inbox.Consumer.DeliverBatch. It checks that published
// messages are confirmed and received intact, that one consumer receives the
// messages of one key in publishing order, that a delivery the consumer asks
// to retry comes back with its attempt increased and the later messages of
// its key wait behind it, that a pause holds messages back without losing or
// spinning on them, and that confirmed messages survive a broker restart.
package brokertest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// Options are what a test asks of a new instance.
type Options struct {
	// EventNames are the names the test publishes; the subscriber must
	// receive all of them (bind, subscribe, create the topic...).
	EventNames []string
}

// Instance is a transport set up for one test, isolated from every other
// test (its own exchange and queue, topic or stream). Messages published
// through it once New has returned are kept for its subscribers, even
// before the first Subscribe (declare the queue, create the stream...).
type Instance struct {
	// Publisher publishes to the test's namespace.
	Publisher broker.Publisher
	// Subscribe starts one consumer, with one worker, receiving every message
	// published through Publisher, and feeding deliver. It returns a stop
	// function that stops the consumer gracefully. Subscribe may be called
	// again after stop, to consume what is left.
	Subscribe func(t *testing.T, deliver broker.DeliverFunc) (stop func())
}

// Features says what a transport supports.
type Features struct {
	// Exclusive, if set, is called at the start of the restart test, before
	// New, to keep the broker to that test (other tests' connections would
	// break).
	Exclusive func(t *testing.T)
	// Restart stops and starts the broker keeping its data; nil when the
	// transport cannot be restarted in tests (the persistence test then
	// fails, to be explicit, unless NoPersistence is set).
	Restart func(t *testing.T)
	// NoPersistence says that the transport does not keep messages across a
	// restart, and skips that test.
	NoPersistence bool
	// Timeout bounds each wait for messages. Defaults to 30s.
	Timeout time.Duration
}

// Transport is a transport under test.
type Transport struct {
	// New returns a fresh, isolated instance. Cleanup (closing the
	// publisher...) is registered on t.
	New      func(t *testing.T, o Options) Instance
	Features Features
}

// Run runs the suite. The restart test runs first and alone (not in
// parallel); the others run in parallel.
func Run(t *testing.T, tr Transport) {
	t.Helper()
	if tr.Features.Timeout == 0 {
		tr.Features.Timeout = 30 * time.Second
	}
	t.Run("PersistenceAcrossRestart", func(t *testing.T) { testPersistence(t, tr) })
	t.Run("PublishConfirm", func(t *testing.T) { t.Parallel(); testPublishConfirm(t, tr) })
	t.Run("OrderPerKey", func(t *testing.T) { t.Parallel(); testOrderPerKey(t, tr) })
	t.Run("RedeliveryOnRetry", func(t *testing.T) { t.Parallel(); testRedelivery(t, tr) })
	t.Run("OrderThroughRetries", func(t *testing.T) { t.Parallel(); testOrderThroughRetries(t, tr) })
	t.Run("Pause", func(t *testing.T) { t.Parallel(); testPause(t, tr) })
}

// NewMessage returns a message of event name with key and a payload holding
// n, as the relay would publish it.
func NewMessage(t testing.TB, name, key string, n int) idem.Message {
	t.Helper()
	ev, err := idem.NewEvent(name, "test", key, map[string]int{"n": n})
	if err != nil {
		t.Fatal(err)
	}
	ev.Headers = map[string]string{"trace": strconv.Itoa(n)}
	m, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// recorder is a DeliverFunc that acks everything and records it.
type recorder struct {
	mu    sync.Mutex
	got   []broker.Delivery
	retry func(d broker.Delivery) bool // return true to ask for a retry
	wake  chan struct{}
}

func newRecorder() *recorder { return &recorder{wake: make(chan struct{}, 1)} }

func (r *recorder) deliver(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	disps := make([]broker.Disposition, len(ds))
	r.mu.Lock()
	for i, d := range ds {
		r.got = append(r.got, d)
		if r.retry != nil && r.retry(d) {
			disps[i] = broker.Disposition{Action: broker.Retry, Outcome: broker.Failed, RetryAfter: 10 * time.Millisecond}
		} else {
			disps[i] = broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
		}
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return disps, make([]error, len(ds))
}

func (r *recorder) snapshot() []broker.Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// waitFor waits until cond holds for the recorded deliveries.
func (r *recorder) waitFor(t *testing.T, timeout time.Duration, what string, cond func([]broker.Delivery) bool) []broker.Delivery {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		got := r.snapshot()
		if cond(got) {
			return got
		}
		select {
		case <-r.wake:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s; received %d deliveries", timeout, what, len(got))
		}
	}
}

func distinct(ds []broker.Delivery) int {
	seen := map[string]bool{}
	for _, d := range ds {
		seen[d.Message.EventID.String()] = true
	}
	return len(seen)
}

func publish(t *testing.T, p broker.Publisher, msgs []idem.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Publish(ctx, msgs); err != nil {
		t.Fatalf("Publish %d message(s): %v", len(msgs), err)
	}
}

func testPublishConfirm(t *testing.T, tr Transport) {
	names := []string{"test.thing.created.v1", "test.thing.deleted.v1"}
	inst := tr.New(t, Options{EventNames: names})
	var msgs []idem.Message
	for i := range 50 {
		msgs = append(msgs, NewMessage(t, names[i%2], "k"+strconv.Itoa(i%7), i))
	}
	rec := newRecorder()
	stop := inst.Subscribe(t, rec.deliver)
	defer stop()
	publish(t, inst.Publisher, msgs[:1])
	publish(t, inst.Publisher, msgs[1:])
	got := rec.waitFor(t, tr.Features.Timeout, "50 messages", func(ds []broker.Delivery) bool { return distinct(ds) >= len(msgs) })
	byID := map[string]broker.Delivery{}
	for _, d := range got {
		byID[d.Message.EventID.String()] = d
	}
	for _, m := range msgs {
		d, ok := byID[m.EventID.String()]
		if !ok {
			t.Fatalf("message %s not received", m.EventID)
		}
		if string(d.Message.Body) != string(m.Body) {
			t.Errorf("body of %s = %s, want %s", m.EventID, d.Message.Body, m.Body)
		}
		if d.Message.EventName != m.EventName {
			t.Errorf("event name of %s = %q, want %q", m.EventID, d.Message.EventName, m.EventName)
		}
		if d.Message.Headers["trace"] != m.Headers["trace"] {
			t.Errorf("header trace of %s = %q, want %q", m.EventID, d.Message.Headers["trace"], m.Headers["trace"])
		}
		if string(d.Message.Key) != string(m.Key) {
			t.Errorf("key of %s = %q, want %q", m.EventID, d.Message.Key, m.Key)
		}
		if d.Attempt != 1 {
			t.Errorf("attempt of %s = %d, want 1", m.EventID, d.Attempt)
		}
		ev, err := idem.Decode(d.Message)
		if err != nil || ev.ID != m.EventID {
			t.Errorf("decode %s: %v (id %s)", m.EventID, err, ev.ID)
		}
	}
}

func testOrderPerKey(t *testing.T, tr Transport) {
	name := "test.thing.changed.v1"
	inst := tr.New(t, Options{EventNames: []string{name}})
	const keys, perKey = 5, 40
	want := map[string][]string{}
	// Calls of 10 messages; the messages of a key in one call are in order
	// and each call returns before the next starts.
	var batch []idem.Message
	for i := range perKey {
		for k := range keys {
			key := "agg-" + strconv.Itoa(k)
			m := NewMessage(t, name, key, i)
			want[key] = append(want[key], m.EventID.String())
			batch = append(batch, m)
		}
		if len(batch) >= 10 {
			publish(t, inst.Publisher, batch)
			batch = nil
		}
	}
	if len(batch) > 0 {
		publish(t, inst.Publisher, batch)
	}
	rec := newRecorder()
	stop := inst.Subscribe(t, rec.deliver)
	defer stop()
	got := rec.waitFor(t, tr.Features.Timeout, "every message", func(ds []broker.Delivery) bool { return distinct(ds) >= keys*perKey })
	order := map[string][]string{}
	for _, d := range got {
		k := string(d.Message.Key)
		order[k] = append(order[k], d.Message.EventID.String())
	}
	for k, ids := range want {
		if !slices.Equal(order[k], ids) {
			t.Errorf("key %s: received %d messages out of publishing order", k, len(order[k]))
		}
	}
}

func testRedelivery(t *testing.T, tr Transport) {
	name := "test.thing.retried.v1"
	inst := tr.New(t, Options{EventNames: []string{name}})
	msgs := []idem.Message{NewMessage(t, name, "a", 1), NewMessage(t, name, "b", 2), NewMessage(t, name, "c", 3)}
	rec := newRecorder()
	rec.retry = func(d broker.Delivery) bool { return d.Attempt < 3 }
	stop := inst.Subscribe(t, rec.deliver)
	defer stop()
	publish(t, inst.Publisher, msgs)
	got := rec.waitFor(t, tr.Features.Timeout, "three attempts of each message", func(ds []broker.Delivery) bool {
		return len(ds) >= 3*len(msgs)
	})
	for _, m := range msgs {
		var attempts []int
		for _, d := range got {
			if d.Message.EventID == m.EventID {
				attempts = append(attempts, d.Attempt)
				if string(d.Message.Body) != string(m.Body) {
					t.Errorf("redelivered body differs: %s", d.Message.Body)
				}
			}
		}
		if !slices.Equal(attempts, []int{1, 2, 3}) {
			t.Errorf("message %s: attempts %v, want [1 2 3]", m.EventID, attempts)
		}
	}
}

// settled is a delivery and what the consumer said of it.
type settled struct {
	d   broker.Delivery
	act broker.Action
	at  time.Time
}

// consumerStandIn behaves as inbox.Consumer.DeliverBatch does towards a
// transport: decide(d) gives each delivery's action, and within one call a
// message whose key had an earlier message retried or paused is not
// attempted (Deferred), as the consumer does to keep an aggregate's order.
type consumerStandIn struct {
	mu     sync.Mutex
	log    []settled
	decide func(d broker.Delivery) broker.Disposition
	wake   chan struct{}
}

func (c *consumerStandIn) deliver(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	disps := make([]broker.Disposition, len(ds))
	blocked := map[string]broker.Disposition{}
	now := time.Now()
	c.mu.Lock()
	for i, d := range ds {
		k := string(d.Message.Key)
		if b, ok := blocked[k]; ok && k != "" {
			disps[i] = broker.Disposition{Action: b.Action, Outcome: broker.Deferred, RetryAfter: b.RetryAfter}
		} else {
			disps[i] = c.decide(d)
			if disps[i].Action != broker.Ack {
				blocked[k] = disps[i]
			}
		}
		c.log = append(c.log, settled{d: d, act: disps[i].Action, at: now})
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return disps, make([]error, len(ds))
}

func (c *consumerStandIn) waitFor(t *testing.T, timeout time.Duration, what string, cond func([]settled) bool) []settled {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		got := slices.Clone(c.log)
		c.mu.Unlock()
		if cond(got) {
			return got
		}
		select {
		case <-c.wake:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s; %d deliveries", timeout, what, len(got))
		}
	}
}

func acked(log []settled) map[string]int {
	n := map[string]int{}
	for _, s := range log {
		if s.act == broker.Ack {
			n[s.d.Message.EventID.String()]++
		}
	}
	return n
}

// testOrderThroughRetries: the first message of key "a" is retried twice;
// the later messages of "a" are applied only after it, in order, and the
// messages of another key are all applied.
func testOrderThroughRetries(t *testing.T, tr Transport) {
	name := "test.order.changed.v1"
	inst := tr.New(t, Options{EventNames: []string{name}})
	var msgs, keyA []idem.Message
	for i := range 6 {
		a := NewMessage(t, name, "a", i)
		msgs = append(msgs, a, NewMessage(t, name, "b", i))
		keyA = append(keyA, a)
	}
	first := keyA[0].EventID
	c := &consumerStandIn{wake: make(chan struct{}, 1)}
	var fails int
	c.decide = func(d broker.Delivery) broker.Disposition {
		if d.Message.EventID == first && fails < 2 {
			fails++
			return broker.Disposition{Action: broker.Retry, Outcome: broker.Failed, RetryAfter: 200 * time.Millisecond}
		}
		return broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
	}
	stop := inst.Subscribe(t, c.deliver)
	defer stop()
	publish(t, inst.Publisher, msgs)
	log := c.waitFor(t, tr.Features.Timeout, "every message applied", func(log []settled) bool {
		return len(acked(log)) >= len(msgs)
	})
	var order []string
	for _, s := range log {
		if s.act == broker.Ack && string(s.d.Message.Key) == "a" {
			order = append(order, s.d.Message.EventID.String())
		}
	}
	var want []string
	for _, m := range keyA {
		want = append(want, m.EventID.String())
	}
	if !slices.Equal(order[:min(len(order), len(want))], want) {
		t.Errorf("key a applied in the order %v, want %v: a later event overtook the retried one", order, want)
	}
	if fails != 2 {
		t.Errorf("the first message failed %d times, want 2", fails)
	}
}

// testPause: the consumer pauses (its database is away) for a while. No
// message is acknowledged meanwhile, a paused message is delivered again no
// sooner than the pause asked, and afterwards every message is applied.
func testPause(t *testing.T, tr Transport) {
	name := "test.thing.paused.v1"
	inst := tr.New(t, Options{EventNames: []string{name}})
	var msgs []idem.Message
	for i := range 30 {
		msgs = append(msgs, NewMessage(t, name, "k"+strconv.Itoa(i%4), i))
	}
	const pause = 200 * time.Millisecond
	c := &consumerStandIn{wake: make(chan struct{}, 1)}
	var until time.Time
	c.decide = func(d broker.Delivery) broker.Disposition {
		now := time.Now()
		if until.IsZero() {
			until = now.Add(1500 * time.Millisecond)
		}
		if now.Before(until) {
			return broker.Disposition{Action: broker.Pause, Outcome: broker.Paused, RetryAfter: pause}
		}
		return broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
	}
	stop := inst.Subscribe(t, c.deliver)
	defer stop()
	publish(t, inst.Publisher, msgs)
	log := c.waitFor(t, tr.Features.Timeout, "every message applied after the pause", func(log []settled) bool {
		return len(acked(log)) >= len(msgs)
	})
	last := map[string]time.Time{}
	for _, s := range log {
		id := s.d.Message.EventID.String()
		if prev, ok := last[id]; ok && s.at.Sub(prev) < pause*8/10 {
			t.Errorf("message %s delivered again %v after a pause of %v", id, s.at.Sub(prev), pause)
		}
		if s.act == broker.Pause {
			last[id] = s.at
		} else {
			delete(last, id)
		}
	}
	for _, m := range msgs {
		if acked(log)[m.EventID.String()] == 0 {
			t.Errorf("message %s lost", m.EventID)
		}
	}
}

func testPersistence(t *testing.T, tr Transport) {
	if tr.Features.NoPersistence {
		t.Skip("the transport does not keep messages across a broker restart (Features.NoPersistence)")
	}
	if tr.Features.Restart == nil {
		t.Fatal("Features.Restart is nil: the suite cannot restart the broker (set NoPersistence if the transport keeps nothing)")
	}
	if tr.Features.Exclusive != nil {
		tr.Features.Exclusive(t)
	}
	name := "test.thing.kept.v1"
	inst := tr.New(t, Options{EventNames: []string{name}})
	// Subscribe once so the queue or stream exists, then stop.
	first := newRecorder()
	inst.Subscribe(t, first.deliver)()
	var msgs []idem.Message
	for i := range 100 {
		msgs = append(msgs, NewMessage(t, name, fmt.Sprint(i%3), i))
	}
	publish(t, inst.Publisher, msgs)
	tr.Features.Restart(t)
	// A publisher that lived through the restart must work again (it may
	// fail while reconnecting: retry with a deadline).
	extra := NewMessage(t, name, "x", 100)
	deadline := time.Now().Add(tr.Features.Timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := inst.Publisher.Publish(ctx, []idem.Message{extra})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // reconnection backoff, not a wait for a result
	}
	msgs = append(msgs, extra)
	rec := newRecorder()
	stop := inst.Subscribe(t, rec.deliver)
	defer stop()
	got := rec.waitFor(t, tr.Features.Timeout, "every message after restart", func(ds []broker.Delivery) bool { return distinct(ds) >= len(msgs) })
	seen := map[string]bool{}
	for _, d := range got {
		seen[d.Message.EventID.String()] = true
	}
	for _, m := range msgs {
		if !seen[m.EventID.String()] {
			t.Errorf("message %s lost across the restart", m.EventID)
		}
	}
}
