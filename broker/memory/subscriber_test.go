package memory_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/memory"
)

// recorder is a DeliverFunc that answers with decide and records what it
// was given.
type recorder struct {
	mu     sync.Mutex
	got    []broker.Delivery
	decide func(broker.Delivery) broker.Disposition
}

func (r *recorder) deliver(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	disps := make([]broker.Disposition, len(ds))
	for i, d := range ds {
		r.got = append(r.got, d)
		disps[i] = broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
		if r.decide != nil {
			disps[i] = r.decide(d)
		}
	}
	return disps, make([]error, len(ds))
}

func (r *recorder) deliveries() []broker.Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]broker.Delivery(nil), r.got...)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A queue keeps, for each consumer, what was accepted once it exists:
// refused messages and those of a failed call are not queued, those of a
// lost confirm are (the broker has them).
func TestQueueKeepsAccepted(t *testing.T) {
	ctx := ctxT(t)
	pub := memory.New()
	before := brokertest.NewMessage(t, "test.thing.created.v1", "k", 0)
	brokertest.Publish(t, pub, before)
	pub.Declare("a", "b")

	pub.Fail(errors.New("down"))
	if err := pub.Publish(ctx, []idem.Message{brokertest.NewMessage(t, "test.thing.created.v1", "k", 1)}); err == nil {
		t.Fatal("Publish while failing: nil error")
	}
	pub.Recover()
	pub.SetFunc(func(int, []idem.Message) memory.Action { return memory.Action{LoseConfirm: true} })
	_ = pub.Publish(ctx, []idem.Message{brokertest.NewMessage(t, "test.thing.created.v1", "k", 2)})
	pub.SetFunc(nil)
	brokertest.Publish(t, pub, brokertest.NewMessage(t, "test.thing.created.v1", "k", 3))

	for _, c := range []string{"a", "b"} {
		if n := pub.Pending(c); n != 2 {
			t.Errorf("Pending(%s) = %d, want 2 (the lost confirm's message and the last one)", c, n)
		}
	}
	if n := pub.Pending("nobody"); n != 0 {
		t.Errorf("Pending of a consumer without a queue = %d, want 0", n)
	}
}

// Messages not acknowledged when a subscriber stops stay in the queue, and
// the next subscriber gets them, with their attempt counted.
func TestUnackedStayForTheNextSubscriber(t *testing.T) {
	ctx := ctxT(t)
	pub := memory.New()
	msg := brokertest.NewMessage(t, "test.thing.created.v1", "k", 0)
	first := &recorder{decide: func(broker.Delivery) broker.Disposition {
		return broker.Disposition{Action: broker.Retry, Outcome: broker.Failed, RetryAfter: time.Hour}
	}}
	sub, err := pub.NewSubscriber(memory.SubscriberConfig{Consumer: "stock"}, first.deliver)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	brokertest.Publish(t, pub, msg)
	if err := pub.Wait(ctx, func([]idem.Message, int) bool { return len(first.deliveries()) == 1 }); err != nil {
		t.Fatal(err)
	}
	if err := sub.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pub.Pending("stock"); n != 1 {
		t.Fatalf("Pending after a retry and a stop = %d, want 1", n)
	}

	second := &recorder{}
	sub2, err := pub.NewSubscriber(memory.SubscriberConfig{Consumer: "stock"}, second.deliver)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer sub2.Stop(ctx)
	if err := pub.WaitPending(ctx, "stock"); err != nil {
		t.Fatal(err)
	}
	got := second.deliveries()
	if len(got) != 1 || got[0].Message.EventID != msg.EventID || got[0].Attempt != 2 || got[0].Source != "stock" {
		t.Fatalf("the next subscriber got %+v, want the message once, attempt 2, source stock", got)
	}
}

// Redeliver sends to one queue only; a source without a queue is
// unroutable.
func TestRedeliverToOneQueue(t *testing.T) {
	ctx := ctxT(t)
	pub := memory.New()
	pub.Declare("a", "b")
	msg := brokertest.NewMessage(t, "test.thing.created.v1", "k", 0)
	if err := pub.Redeliver(ctx, "a", []idem.Message{msg}); err != nil {
		t.Fatal(err)
	}
	if a, b, n := pub.Pending("a"), pub.Pending("b"), pub.Len(); a != 1 || b != 0 || n != 0 {
		t.Errorf("after Redeliver to a: pending a %d, b %d, accepted %d; want 1, 0, 0", a, b, n)
	}
	if err := pub.Redeliver(ctx, "nobody", []idem.Message{msg}); !errors.Is(err, broker.ErrUnroutable) {
		t.Errorf("Redeliver to a source without a queue: %v, want ErrUnroutable", err)
	}
}

// A delivery the consumer can neither handle nor park (an error) stays in
// the queue and comes again after ErrorRetryDelay; so does one answered
// with no disposition.
func TestErrorsAreDeliveredAgain(t *testing.T) {
	ctx := ctxT(t)
	pub := memory.New()
	var mu sync.Mutex
	calls := 0
	deliver := func(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		switch calls {
		case 1:
			return make([]broker.Disposition, len(ds)), []error{errors.New("failure store away")}
		case 2:
			return nil, nil
		}
		disps := make([]broker.Disposition, len(ds))
		for i := range disps {
			disps[i] = broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
		}
		return disps, make([]error, len(ds))
	}
	sub, err := pub.NewSubscriber(memory.SubscriberConfig{Consumer: "stock", ErrorRetryDelay: time.Millisecond, Logger: brokertest.LogTo(t)}, deliver)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer sub.Stop(ctx)
	brokertest.Publish(t, pub, brokertest.NewMessage(t, "test.thing.created.v1", "k", 0))
	if err := pub.WaitPending(ctx, "stock"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 3 {
		t.Errorf("delivered %d times, want 3 (an error, no disposition, then acknowledged)", calls)
	}
}
