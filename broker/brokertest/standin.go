package brokertest

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// The tests of this file put a stand-in consumer behind the subscriber, to
// see each delivery and decide what becomes of it.

// standInName is the consumer name of the stand-in tests.
const standInName = "standin"

// settled is a delivery and what the consumer said of it.
type settled struct {
	d   broker.Delivery
	act broker.Action
	at  time.Time
}

// standIn behaves as inbox.Consumer.DeliverBatch does towards a transport:
// decide(d) gives each delivery's disposition (nil: acknowledge), and within
// one call a message whose key had an earlier message retried or paused is
// not attempted (Deferred), as the consumer does to keep an aggregate's
// order.
type standIn struct {
	mu     sync.Mutex
	log    []settled
	decide func(d broker.Delivery) broker.Disposition
	wake   chan struct{}
}

// subscribeStandIn returns an instance for a stand-in test and its consumer,
// subscribed; decide may be nil.
func subscribeStandIn(t *testing.T, tr Transport, decide func(broker.Delivery) broker.Disposition, names ...string) (Instance, *standIn) {
	t.Helper()
	inst := newInstance(t, tr, Options{EventNames: names, Consumers: []string{standInName}})
	c := &standIn{decide: decide, wake: make(chan struct{}, 1)}
	start(t, inst.NewSubscriber(t, standInName, c.deliver))
	return inst, c
}

func (c *standIn) deliver(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	disps := make([]broker.Disposition, len(ds))
	blocked := map[string]broker.Disposition{}
	now := time.Now()
	c.mu.Lock()
	for i, d := range ds {
		k := string(d.Message.Key)
		if b, ok := blocked[k]; ok && k != "" {
			disps[i] = broker.Disposition{Action: b.Action, Outcome: broker.Deferred, RetryAfter: b.RetryAfter}
		} else {
			disps[i] = broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
			if c.decide != nil {
				disps[i] = c.decide(d)
			}
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

// waitAcked waits until n distinct messages are acknowledged, and returns
// the log.
func (c *standIn) waitAcked(t *testing.T, timeout time.Duration, n int) []settled {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		log := slices.Clone(c.log)
		c.mu.Unlock()
		if len(acked(log)) >= n {
			return log
		}
		select {
		case <-c.wake:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %d messages acknowledged; %d deliveries, %d acknowledged", timeout, n, len(log), len(acked(log)))
		}
	}
}

// acked counts the acknowledgements of each event id.
func acked(log []settled) map[string]int {
	n := map[string]int{}
	for _, s := range log {
		if s.act == broker.Ack {
			n[s.d.Message.EventID.String()]++
		}
	}
	return n
}

// testPublishConfirm: published messages are confirmed and received
// intact, at their first attempt.
func testPublishConfirm(t *testing.T, tr Transport) {
	names := []string{"test.thing.created.v1", "test.thing.deleted.v1"}
	inst, c := subscribeStandIn(t, tr, nil, names...)
	var msgs []idem.Message
	for i := range 50 {
		msgs = append(msgs, NewMessage(t, names[i%2], "k"+strconv.Itoa(i%7), i))
	}
	Publish(t, inst.Publisher, msgs[:1]...)
	Publish(t, inst.Publisher, msgs[1:]...)
	byID := map[string]broker.Delivery{}
	for _, s := range c.waitAcked(t, tr.Features.Timeout, len(msgs)) {
		byID[s.d.Message.EventID.String()] = s.d
	}
	for _, m := range msgs {
		d := byID[m.EventID.String()]
		if string(d.Message.Body) != string(m.Body) || d.Message.EventName != m.EventName ||
			d.Message.Headers["trace"] != m.Headers["trace"] || string(d.Message.Key) != string(m.Key) || d.Attempt != 1 {
			t.Errorf("received %s as body %s, name %q, header trace %q, key %q, attempt %d; want %s, %q, %q, %q, 1",
				m.EventID, d.Message.Body, d.Message.EventName, d.Message.Headers["trace"], d.Message.Key, d.Attempt,
				m.Body, m.EventName, m.Headers["trace"], m.Key)
		}
		if ev, err := idem.Decode(d.Message); err != nil || ev.ID != m.EventID {
			t.Errorf("decode %s: %v (id %s)", m.EventID, err, ev.ID)
		}
	}
}

// testOrderPerKey: one consumer receives the messages of one key in
// publishing order.
func testOrderPerKey(t *testing.T, tr Transport) {
	name := "test.thing.changed.v1"
	const keys, perKey = 5, 40
	want := map[string][]string{}
	// Calls of 10 messages; the messages of a key in one call are in order
	// and each call returns before the next starts.
	var msgs []idem.Message
	for i := range perKey {
		for k := range keys {
			m := NewMessage(t, name, "agg-"+strconv.Itoa(k), i)
			want[string(m.Key)] = append(want[string(m.Key)], m.EventID.String())
			msgs = append(msgs, m)
		}
	}
	inst, c := subscribeStandIn(t, tr, nil, name)
	for batch := range slices.Chunk(msgs, 10) {
		Publish(t, inst.Publisher, batch...)
	}
	order := map[string][]string{}
	for _, s := range c.waitAcked(t, tr.Features.Timeout, len(msgs)) {
		order[string(s.d.Message.Key)] = append(order[string(s.d.Message.Key)], s.d.Message.EventID.String())
	}
	for k, ids := range want {
		if !slices.Equal(order[k], ids) {
			t.Errorf("key %s: received %d messages out of publishing order", k, len(order[k]))
		}
	}
}

// testOrderThroughRetries: the first message of key "a" is retried twice;
// the later messages of "a" are applied only after it, in order, and the
// messages of another key are all applied.
func testOrderThroughRetries(t *testing.T, tr Transport) {
	name := "test.order.changed.v1"
	var msgs, keyA []idem.Message
	for i := range 6 {
		a := NewMessage(t, name, "a", i)
		msgs = append(msgs, a, NewMessage(t, name, "b", i))
		keyA = append(keyA, a)
	}
	first := keyA[0].EventID
	var fails atomic.Int32
	inst, c := subscribeStandIn(t, tr, func(d broker.Delivery) broker.Disposition {
		if d.Message.EventID == first && fails.Load() < 2 {
			fails.Add(1)
			return broker.Disposition{Action: broker.Retry, Outcome: broker.Failed, RetryAfter: 200 * time.Millisecond}
		}
		return broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
	}, name)
	Publish(t, inst.Publisher, msgs...)
	var order, want []string
	for _, s := range c.waitAcked(t, tr.Features.Timeout, len(msgs)) {
		if s.act == broker.Ack && string(s.d.Message.Key) == "a" {
			order = append(order, s.d.Message.EventID.String())
		}
	}
	for _, m := range keyA {
		want = append(want, m.EventID.String())
	}
	if !slices.Equal(order[:min(len(order), len(want))], want) {
		t.Errorf("key a applied in the order %v, want %v: a later event overtook the retried one", order, want)
	}
	if n := fails.Load(); n != 2 {
		t.Errorf("the first message failed %d times, want 2", n)
	}
}

// testPause: the consumer pauses (its database is away) for a while. No
// message is acknowledged meanwhile, a paused message is delivered again no
// sooner than the pause asked, and afterwards every message is applied.
func testPause(t *testing.T, tr Transport) {
	name := "test.thing.paused.v1"
	var msgs []idem.Message
	for i := range 30 {
		msgs = append(msgs, NewMessage(t, name, "k"+strconv.Itoa(i%4), i))
	}
	const pause = 200 * time.Millisecond
	var until time.Time // the stand-in's lock guards it
	inst, c := subscribeStandIn(t, tr, func(d broker.Delivery) broker.Disposition {
		now := time.Now()
		if until.IsZero() {
			until = now.Add(1500 * time.Millisecond)
		}
		if now.Before(until) {
			return broker.Disposition{Action: broker.Pause, Outcome: broker.Paused, RetryAfter: pause}
		}
		return broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
	}, name)
	Publish(t, inst.Publisher, msgs...)
	log := c.waitAcked(t, tr.Features.Timeout, len(msgs))
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
}

// testConcurrentStops: two Stop calls at once both return only once the
// batch in progress has ended, and the subscriber is done then.
func testConcurrentStops(t *testing.T, tr Transport) {
	name := "test.thing.stopped.v1"
	inst := newInstance(t, tr, Options{EventNames: []string{name}, Consumers: []string{standInName}})
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var ended atomic.Bool
	sub := inst.NewSubscriber(t, standInName, func(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		once.Do(func() { close(entered) })
		<-release
		disps := make([]broker.Disposition, len(ds))
		for i := range disps {
			disps[i] = broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
		}
		ended.Store(true)
		return disps, make([]error, len(ds))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	Publish(t, inst.Publisher, NewMessage(t, name, "1", 1))
	<-entered
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if err := sub.Stop(ctx); err != nil {
				t.Errorf("Stop: %v", err)
			}
			if !ended.Load() {
				t.Error("a Stop call returned while a batch was in progress")
			}
		})
	}
	// Gives the Stop calls time to begin before the batch ends, so that
	// they have something to wait for; what is checked does not depend on
	// it: each call checks, when it returns, that the batch had ended.
	time.Sleep(100 * time.Millisecond)
	close(release)
	wg.Wait()
	if d, ok := sub.(interface{ Done() <-chan struct{} }); ok {
		select {
		case <-d.Done():
		default:
			t.Fatal("Done not closed after Stop returned")
		}
	}
}

// testInspect: messages published while a consumer is away show up as
// waiting for it in the publisher's broker.Inspector, a consumer the
// broker does not know is left out, and once a subscriber has handled
// them nothing waits. Without Features.Inspect, the publisher must not be
// an Inspector.
func testInspect(t *testing.T, tr Transport) {
	name := "test.thing.created.v1"
	inst := newInstance(t, tr, Options{EventNames: []string{name}, Consumers: []string{standInName}})
	ins, ok := inst.Publisher.(broker.Inspector)
	if !tr.Features.Inspect {
		if ok {
			t.Fatalf("publisher %T is a broker.Inspector, but Features.Inspect is false", inst.Publisher)
		}
		return
	}
	if !ok {
		t.Fatalf("publisher %T is not a broker.Inspector (Features.Inspect)", inst.Publisher)
	}
	// The consumer handles one message, so that every broker knows it (a
	// Kafka group has committed offsets), then goes away.
	first := &standIn{wake: make(chan struct{}, 1)}
	stop := start(t, inst.NewSubscriber(t, standInName, first.deliver))
	Publish(t, inst.Publisher, NewMessage(t, name, "k0", 0))
	first.waitAcked(t, tr.Features.Timeout, 1)
	stop()

	const n = 5
	var msgs []idem.Message
	for i := range n {
		msgs = append(msgs, NewMessage(t, name, "k"+strconv.Itoa(i), i+1))
	}
	Publish(t, inst.Publisher, msgs...)
	waitWaiting := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(tr.Features.Timeout)
		var last []broker.QueueStats
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			qs, err := ins.Inspect(ctx, []string{"nobody-" + standInName, standInName})
			cancel()
			if err != nil {
				t.Fatalf("Inspect: %v", err)
			}
			if len(qs) == 1 && qs[0].Consumer == standInName && qs[0].Waiting() == want {
				if qs[0].Queue == "" {
					t.Errorf("Inspect: %+v: no queue, durable or group named", qs[0])
				}
				return
			}
			last = qs
			if time.Now().After(deadline) {
				t.Fatalf("Inspect: %+v after %v; want only %s, with %d waiting (a consumer the broker does not know left out)", last, tr.Features.Timeout, standInName, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitWaiting(n)

	second := &standIn{wake: make(chan struct{}, 1)}
	start(t, inst.NewSubscriber(t, standInName, second.deliver))
	second.waitAcked(t, tr.Features.Timeout, n)
	waitWaiting(0)
}
