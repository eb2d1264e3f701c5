package brokertest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// PublisherTransport is a publisher without a subscriber under test
// (RunPublisher): broker/webhook, and broker/memory's test controls.
type PublisherTransport struct {
	// New returns a fresh publisher, isolated from every other test's.
	// Cleanup is registered on t.
	New func(t *testing.T) PublisherInstance
	// Features says which optional interfaces the publisher implements;
	// the suite checks that it implements those and no other.
	Features PublisherFeatures
}

// PublisherFeatures are the optional interfaces of broker a publisher
// implements.
type PublisherFeatures struct {
	// Redeliver: the publisher is a broker.Redeliverer.
	Redeliver bool
	// Inspect: the publisher is a broker.Inspector.
	Inspect bool
	// Describe: the publisher is a broker.Describer.
	Describe bool
}

// PublisherInstance is a publisher set up for one test, and what the suite
// needs to see and steer the other side.
type PublisherInstance struct {
	// Publisher is the publisher under test.
	Publisher broker.Publisher
	// Accepted returns the messages the other side (broker, endpoint) has
	// accepted so far, in the order it accepted them, each as it received
	// it.
	Accepted func(t *testing.T) []idem.Message
	// Refuse makes the other side refuse, from now on, the
	// messages for which refuse returns true (one by one, as a broker
	// nacks a message), and accept the others; nil refuse accepts every
	// message again.
	Refuse func(t *testing.T, refuse func(idem.Message) bool)
	// Away makes the other side unreachable or failing as a whole (true),
	// or brings it back (false).
	Away func(t *testing.T, away bool)
}

// RunPublisher runs the suite's checks of broker.Publisher alone, for
// implementations that have no subscriber: confirmed messages are accepted
// intact, once per call; an empty call sends nothing; concurrent calls are
// safe; a cancelled call is a fault, never a refusal; a refused message
// is reported in a *broker.BatchError, with one entry per message, as a
// refusal, while the others are accepted; a broker away fails the whole
// call without marking it refused, and the publisher works again once the
// broker is back. No check is skipped. Transports with a
// subscriber check publishing through Run.
func RunPublisher(t *testing.T, tr PublisherTransport) {
	t.Helper()
	tests := []struct {
		name string
		run  func(*testing.T, PublisherTransport)
	}{
		{"Interfaces", testPublisherInterfaces},
		{"Accepted", testPublisherAccepted},
		{"EmptyCall", testPublisherEmptyCall},
		{"ConcurrentCalls", testPublisherConcurrent},
		{"CancelledCall", testPublisherCancelled},
		{"RefusedMessages", testPublisherRefused},
		{"BrokerAway", testPublisherAway},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { t.Parallel(); tc.run(t, tr) })
	}
}

func newPublisherInstance(t *testing.T, tr PublisherTransport) PublisherInstance {
	t.Helper()
	inst := tr.New(t)
	switch {
	case inst.Publisher == nil:
		t.Fatal("brokertest: the transport's PublisherInstance has no Publisher")
	case inst.Accepted == nil:
		t.Fatal("brokertest: the transport's PublisherInstance has no Accepted")
	case inst.Refuse == nil:
		t.Fatal("brokertest: the transport's PublisherInstance has no Refuse")
	case inst.Away == nil:
		t.Fatal("brokertest: the transport's PublisherInstance has no Away")
	}
	return inst
}

func testPublisherInterfaces(t *testing.T, tr PublisherTransport) {
	pub := newPublisherInstance(t, tr).Publisher
	for _, c := range []struct {
		name      string
		has, want bool
	}{
		{"broker.Redeliverer", is[broker.Redeliverer](pub), tr.Features.Redeliver},
		{"broker.Inspector", is[broker.Inspector](pub), tr.Features.Inspect},
		{"broker.Describer", is[broker.Describer](pub), tr.Features.Describe},
	} {
		if c.has != c.want {
			t.Errorf("%T implements %s: %v; its Features say %v", pub, c.name, c.has, c.want)
		}
	}
}

func is[I any](v any) bool {
	_, ok := v.(I)
	return ok
}

// publisherMessages returns n messages of a few keys, names and headers.
func publisherMessages(t *testing.T, n int) []idem.Message {
	names := []string{"test.thing.created.v1", "test.thing.deleted.v1"}
	var msgs []idem.Message
	for i := range n {
		msgs = append(msgs, NewMessage(t, names[i%2], "k"+strconv.Itoa(i%3), i))
	}
	return msgs
}

// checkAccepted fails the test unless the other side accepted each of want
// once, intact, and nothing else.
func checkAccepted(t *testing.T, got, want []idem.Message) {
	t.Helper()
	byID := map[string][]idem.Message{}
	for _, m := range got {
		byID[m.EventID.String()] = append(byID[m.EventID.String()], m)
	}
	for _, m := range want {
		ms := byID[m.EventID.String()]
		if len(ms) != 1 {
			t.Errorf("message %s accepted %d times, want once", m.EventID, len(ms))
			continue
		}
		if err := sameMessage(ms[0], m); err != nil {
			t.Errorf("message %s: %v", m.EventID, err)
		}
		delete(byID, m.EventID.String())
	}
	for id := range byID {
		t.Errorf("message %s accepted, though not published (or refused)", id)
	}
}

func sameMessage(got, want idem.Message) error {
	if got.EventID != want.EventID || got.EventName != want.EventName || got.AggregateType != want.AggregateType ||
		string(got.Key) != string(want.Key) || string(got.Body) != string(want.Body) || len(got.Headers) != len(want.Headers) {
		return fmt.Errorf("accepted as %+v, want %+v", got, want)
	}
	for k, v := range want.Headers {
		if got.Headers[k] != v {
			return fmt.Errorf("header %q = %q, want %q", k, got.Headers[k], v)
		}
	}
	return nil
}

func publishCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// testPublisherAccepted: what a call confirms is accepted, intact, once.
func testPublisherAccepted(t *testing.T, tr PublisherTransport) {
	inst := newPublisherInstance(t, tr)
	msgs := publisherMessages(t, 21)
	Publish(t, inst.Publisher, msgs[:1]...)
	Publish(t, inst.Publisher, msgs[1:]...)
	checkAccepted(t, inst.Accepted(t), msgs)
}

// testPublisherEmptyCall: a call without messages succeeds and sends none.
func testPublisherEmptyCall(t *testing.T, tr PublisherTransport) {
	inst := newPublisherInstance(t, tr)
	if err := inst.Publisher.Publish(publishCtx(t), nil); err != nil {
		t.Fatalf("Publish of no message: %v", err)
	}
	msgs := publisherMessages(t, 1)
	Publish(t, inst.Publisher, msgs...)
	checkAccepted(t, inst.Accepted(t), msgs)
}

// testPublisherConcurrent: several calls at once, as the relay's workers
// make them, each accepted.
func testPublisherConcurrent(t *testing.T, tr PublisherTransport) {
	inst := newPublisherInstance(t, tr)
	msgs := publisherMessages(t, 40)
	var wg sync.WaitGroup
	for i := 0; i < len(msgs); i += 5 {
		wg.Go(func() {
			if err := inst.Publisher.Publish(publishCtx(t), msgs[i:i+5]); err != nil {
				t.Errorf("Publish: %v", err)
			}
		})
	}
	wg.Wait()
	checkAccepted(t, inst.Accepted(t), msgs)
}

// testPublisherCancelled: a call whose context has ended fails, and its
// error is no refusal (the relay would count it toward quarantine).
func testPublisherCancelled(t *testing.T, tr PublisherTransport) {
	inst := newPublisherInstance(t, tr)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := inst.Publisher.Publish(ctx, publisherMessages(t, 3))
	if err == nil {
		t.Fatal("Publish with a cancelled context returned nil")
	}
	checkFault(t, err, 3)
}

// checkFault fails the test unless err, the error of a call of n messages,
// says that the broker did not answer: not a refusal of the call, and each
// per-message error a fault.
func checkFault(t *testing.T, err error, n int) {
	t.Helper()
	if broker.IsRefused(err) {
		t.Errorf("error %v is marked broker.Refused; want a fault", err)
	}
	var be *broker.BatchError
	if errors.As(err, &be) {
		for i, e := range broker.Results(err, n) {
			if e != nil && !broker.IsFault(e) {
				t.Errorf("message %d: error %v is a refusal (broker.IsFault false); want a fault", i, e)
			}
		}
	}
}

// testPublisherRefused: a message the other side refuses is reported in a
// *broker.BatchError, with one entry per message, as a refusal; the others
// are accepted.
func testPublisherRefused(t *testing.T, tr PublisherTransport) {
	inst := newPublisherInstance(t, tr)
	msgs := publisherMessages(t, 7)
	refused := map[string]bool{msgs[2].EventID.String(): true, msgs[5].EventID.String(): true}
	inst.Refuse(t, func(m idem.Message) bool { return refused[m.EventID.String()] })
	err := inst.Publisher.Publish(publishCtx(t), msgs)
	var be *broker.BatchError
	if !errors.As(err, &be) || len(be.Errs) != len(msgs) {
		t.Fatalf("Publish = %v, want a *broker.BatchError with %d entries", err, len(msgs))
	}
	var want []idem.Message
	for i, m := range msgs {
		e := be.Errs[i]
		switch {
		case refused[m.EventID.String()] && (e == nil || broker.IsFault(e)):
			t.Errorf("message %d, refused: error %v, want a refusal (not a fault)", i, e)
		case !refused[m.EventID.String()] && e != nil:
			t.Errorf("message %d, accepted: error %v, want nil", i, e)
		}
		if !refused[m.EventID.String()] {
			want = append(want, m)
		}
	}
	checkAccepted(t, inst.Accepted(t), want)
	inst.Refuse(t, nil)
	Publish(t, inst.Publisher, msgs[2])
	checkAccepted(t, inst.Accepted(t), append(want, msgs[2]))
}

// testPublisherAway: while the other side is away, calls fail as a whole,
// unmarked (the relay retries them for as long as it lasts); once it is
// back, calls succeed.
func testPublisherAway(t *testing.T, tr PublisherTransport) {
	inst := newPublisherInstance(t, tr)
	msgs := publisherMessages(t, 4)
	inst.Away(t, true)
	err := inst.Publisher.Publish(publishCtx(t), msgs[:2])
	if err == nil {
		t.Fatal("Publish while the broker is away returned nil")
	}
	checkFault(t, err, 2)
	inst.Away(t, false)
	Publish(t, inst.Publisher, msgs...)
	checkAccepted(t, inst.Accepted(t), msgs)
}
