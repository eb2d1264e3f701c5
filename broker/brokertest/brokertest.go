// Package brokertest is the conformance suite of idem's transports. A
// transport (broker/amqp, broker/kafka, broker/nats, broker/memory) passes it or is not
// done; a publisher without a subscriber (broker/webhook)
// passes its publisher part, RunPublisher. Its tests are a constructor and
// the flags of what it supports:
//
//	func TestMain(m *testing.M) {
//		brokertest.ChildMain(newChildSubscriber) // returns unless this process is the suite's child
//		goleak.VerifyTestMain(m)
//	}
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, brokertest.Transport{
//			New: func(t *testing.T, o brokertest.Options) brokertest.Instance { ... },
//			Features: brokertest.Features{PerKeyOrder: true, Redeliver: true, Restart: restartBroker, ProcessKill: fault.InboxAfterCommitBeforeAck},
//		})
//	}
//
// The suite talks to a transport through the seams idem uses: a
// broker.Publisher (and broker.Redeliverer), and a broker.Subscriber
// feeding a broker.DeliverFunc, the signature of
// inbox.Consumer.DeliverBatch. A few tests put a stand-in consumer behind
// the subscriber, to see each delivery: published messages are confirmed
// and received intact, the messages of a key arrive in publishing order and
// wait behind one the consumer retries, a pause holds messages back without
// losing or spinning on them, and two Stop calls at once wait for the batch
// in progress.
//
// The others run a real idempotent consumer (inbox.Consumer on a PostgreSQL
// schema of its own, internal/testdb) whose handler writes one row per
// application of an event to a table without unique key, so that a double
// effect shows (EffectConsumer): an event published twice, or sent again
// with Redeliver, is applied once; a handler failing a few times is
// retried, to this consumer only, and applied once; attempts counted
// survive a new subscriber; bodies published by a producer that knows
// nothing of idem are parked once, byte for byte, and the queue flows on,
// while Debezium's messages are applied; a message that keeps failing is
// parked after its retries, holding the later messages of its aggregate,
// while the others flow, and is applied once re-driven with Redeliver, as
// "idem failed retry" does; a message still failing goes to the
// dead-letter destination; messages published while a consumer is away
// show up as waiting for it (broker.Inspector) until it handles them;
// messages survive a broker restart and a running
// subscriber resumes by itself; and a consumer process killed between its
// commit and its acknowledgement (a fault point, internal/fault) leaves its
// effects once, the broker delivers the messages again, and a new consumer
// skips them as duplicates.
//
// Features says which of these a transport supports; a test of a feature
// the transport lacks either checks the documented limitation (a publisher
// that is no broker.Redeliverer) or is not part of its contract. No test is
// ever skipped: a missing server, hook or build tag fails.
//
// CheckDelivery and CheckRoundTrip are for each transport's fuzz test of
// its conversion of received messages. The services a test starts log to
// the test's output (LogTo), so that a failure shows its own lines only.
package brokertest

import (
	"cmp"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/testsvc"
)

// Options are what a test asks of a new instance.
type Options struct {
	// EventNames are the names the test publishes; every consumer must
	// receive all of them (bind, subscribe, create the topic...).
	EventNames []string
	// Consumers are the names the test subscribes as (Instance.Subscribe):
	// each consuming service receives every message once, whatever the
	// others do. Messages published once New has returned are kept for each
	// of them, even before its first Subscribe (declare its queue, create
	// its durable consumer...).
	Consumers []string
	// DeadLetterAfter, when positive (Features.DeadLetter), asks the
	// subscribers to move a message the consumer still asks to retry after
	// that many attempts to the dead-letter destination.
	DeadLetterAfter int
}

// Instance is a transport set up for one test, isolated from every other
// test (its own exchange and queues, topic or stream).
type Instance struct {
	// Publisher publishes to the test's namespace. With Features.Redeliver
	// it is a broker.Redeliverer.
	Publisher broker.Publisher
	// NewSubscriber returns a subscriber, not started, with one worker, as
	// consumer (one of Options.Consumers: its queue, consumer group or
	// durable consumer), receiving every message published through
	// Publisher and feeding deliver. A new subscriber of a consumer that was
	// stopped consumes what is left.
	NewSubscriber func(t *testing.T, consumer string, deliver broker.DeliverFunc) broker.Subscriber
	// PublishRaw publishes body and headers as they are through the
	// broker's own client, as a producer that knows nothing of idem would:
	// routed as an event named name is (routing key, subject, topic), with
	// no event id, name or key of idem's.
	PublishRaw func(t *testing.T, name string, body []byte, headers map[string]string)
	// Backlog returns how many messages published to the instance wait for
	// consumer: not acknowledged, or not committed past, as the broker
	// knows it (RabbitMQ: the messages ready in its queue).
	Backlog func(t *testing.T, consumer string) int
	// DeadLetters (Features.DeadLetter) returns the messages moved so far to
	// the dead-letter destination of consumer's messages.
	DeadLetters func(t *testing.T, consumer string) []idem.Message
	// ChildSpec (Features.ProcessKill) returns what a child process needs to
	// subscribe as consumer, as NewSubscriber does: a value encoded to JSON and
	// given to the function the package's TestMain passes to ChildMain.
	ChildSpec func(consumer string) any
}

// Features says what a transport supports.
type Features struct {
	// PerKeyOrder: one consumer receives the messages of one key in
	// publishing order, and the later messages of a key wait behind one the
	// consumer retries (G4, G10).
	PerKeyOrder bool
	// Redeliver: the publisher is a broker.Redeliverer, which sends a parked
	// message back to the source it was received from ("idem failed
	// retry"). Without it, the suite checks that it is not one.
	Redeliver bool
	// RedeliverReachesAll: a redelivered message reaches every consumer of
	// its source, which skip it if they applied it (Kafka: Redeliver
	// produces to the topic); otherwise only the consumer it came from
	// receives it.
	RedeliverReachesAll bool
	// ConsumerPublisher: the publisher is a broker.ConsumerPublisher, which
	// sends a message to one consumer only ("idem failed retry
	// --to-consumer"). Without it, the suite checks that it is not one.
	ConsumerPublisher bool
	// PublishDeduplicates: the broker drops a message published again with
	// an event id it has seen (JetStream's duplicate window on Nats-Msg-Id),
	// so that a republished message reaches no consumer.
	PublishDeduplicates bool
	// DeliveryCount: the broker counts deliveries, so that a message
	// delivered again after a consumer process died comes with Attempt 2
	// (JetStream). Otherwise its attempt may start again at 1.
	DeliveryCount bool
	// Inspect: the publisher is a broker.Inspector, which tells what waits
	// in the broker for each consumer ("idem status"). Without it, the
	// suite checks that it is not one.
	Inspect bool
	// DeadLetter: the subscriber can move a message that keeps failing to a
	// dead-letter destination (Options.DeadLetterAfter,
	// Instance.DeadLetters) instead of the consumer's failure store.
	DeadLetter bool
	// Restart stops and starts the broker keeping its data (the suite then
	// checks that messages survive it and that a running subscriber
	// resumes). nil when the broker cannot be restarted in tests, and the
	// restart test is not part of the transport's contract.
	Restart func(t *testing.T)
	// Exclusive, if set, is called at the start of the restart test, before
	// New, to keep the broker to that test (other tests' connections would
	// break).
	Exclusive func(t *testing.T)
	// ProcessKill is the fault point (internal/fault) at which a
	// subscriber's process dies between the consumer's commit and the
	// acknowledgement; empty when the transport cannot run in a child
	// process. The package's TestMain must call ChildMain, and
	// Instance.ChildSpec say how to subscribe there.
	ProcessKill string
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
	tr.Features.Timeout = cmp.Or(tr.Features.Timeout, 30*time.Second)
	f := tr.Features
	if f.Restart != nil {
		t.Run("BrokerRestart", func(t *testing.T) { testRestart(t, tr) })
	}
	tests := []struct {
		name string
		run  func(*testing.T, Transport)
		when bool
	}{
		{"PublishConfirm", testPublishConfirm, true},
		{"Pause", testPause, true},
		{"OperatorPause", testOperatorPause, true},
		{"RateLimit", testRateLimit, true},
		{"ConcurrentStops", testConcurrentStops, true},
		{"Inspect", testInspect, true},
		{"OrderPerKey", testOrderPerKey, f.PerKeyOrder},
		{"OrderThroughRetries", testOrderThroughRetries, f.PerKeyOrder},
		{"DeliveredOnce", testDeliveredOnce, true},
		{"RetryThenSuccess", testRetryThenSuccess, true},
		{"AttemptsSurviveNewSubscriber", testAttemptsSurvive, true},
		{"ParkMalformed", testParkMalformed, true},
		{"DebeziumInput", testDebeziumInput, true},
		{"ParkedThenRedriven", testParkedThenRedriven, true},
		{"ToConsumer", testToConsumer, true},
		{"DeadLetter", testDeadLetter, f.DeadLetter},
		{"KillBetweenCommitAndAck", testKillBetweenCommitAndAck, f.ProcessKill != ""},
	}
	for _, tc := range tests {
		if tc.when {
			t.Run(tc.name, func(t *testing.T) { t.Parallel(); tc.run(t, tr) })
		}
	}
}

// newInstance calls tr.New and checks that the instance has what the test
// uses.
func newInstance(t *testing.T, tr Transport, o Options) Instance {
	t.Helper()
	inst := tr.New(t, o)
	missing := func(what string) { t.Fatalf("brokertest: the transport's Instance has no %s", what) }
	switch {
	case inst.Publisher == nil:
		missing("Publisher")
	case inst.NewSubscriber == nil:
		missing("NewSubscriber")
	case inst.Backlog == nil:
		missing("Backlog")
	case inst.PublishRaw == nil:
		missing("PublishRaw")
	case tr.Features.DeadLetter && inst.DeadLetters == nil:
		missing("DeadLetters (Features.DeadLetter is set)")
	case tr.Features.ProcessKill != "" && inst.ChildSpec == nil:
		missing("ChildSpec (Features.ProcessKill is set)")
	}
	return inst
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

// Publish publishes msgs through p or fails the test.
func Publish(t testing.TB, p broker.Publisher, msgs ...idem.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Publish(ctx, msgs); err != nil {
		t.Fatalf("Publish %d message(s): %v", len(msgs), err)
	}
}

// start starts sub and returns a function that stops it (also called at
// the test's cleanup).
func start(t *testing.T, sub broker.Subscriber) (stop func()) {
	t.Helper()
	return testsvc.Start(t, sub)
}
