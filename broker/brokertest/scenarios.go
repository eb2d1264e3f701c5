package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// The tests of this file run a real idempotent consumer (EffectConsumer)
// behind the subscriber.

// fastRetry retries quickly: four attempts, 20ms apart and more.
var fastRetry = inbox.RetryPolicy{InitialDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond, Jitter: -1}

// bundle is what a test with real consumers needs: an instance and the
// consumers' database.
type bundle struct {
	tr   Transport
	inst Instance
	pg   *testdb.PG

	mu        sync.Mutex
	consumers []*inbox.Consumer[pgx.Tx] // for the report of a wait that timed out
	names     []string
}

func setup(t *testing.T, tr Transport, o Options) *bundle {
	t.Helper()
	return &bundle{tr: tr, inst: newInstance(t, tr, o), pg: testdb.NewPostgres(t)}
}

// consumer returns an EffectConsumer named name.
func (b *bundle) consumer(t *testing.T, name string, retry inbox.RetryPolicy, fail func(idem.Event) error) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	c := EffectConsumer(t, b.pg.Driver, inbox.Config{Name: name, Retry: retry}, fail)
	b.mu.Lock()
	b.consumers, b.names = append(b.consumers, c), append(b.names, name)
	b.mu.Unlock()
	return c
}

// subscribe subscribes as name, feeding c through a tape.
func (b *bundle) subscribe(t *testing.T, name string, c *inbox.Consumer[pgx.Tx]) (*tape, func()) {
	t.Helper()
	tp := &tape{}
	return tp, start(t, b.inst.NewSubscriber(t, name, tp.wrap(c.DeliverBatch)))
}

// waitFor waits until cond holds, and fails the test with the consumers'
// counters after Features.Timeout.
func (b *bundle) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(b.tr.Features.Timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			b.mu.Lock()
			var stats []string
			for i, c := range b.consumers {
				stats = append(stats, fmt.Sprintf("%s %+v", b.names[i], c.Stats()))
			}
			b.mu.Unlock()
			t.Fatalf("timed out after %v waiting for %s; consumers: %s", b.tr.Features.Timeout, what, strings.Join(stats, "; "))
		}
		<-tick.C
	}
}

// drained waits until nothing waits for consumer name in the broker.
func (b *bundle) drained(t *testing.T, name string) {
	t.Helper()
	b.waitFor(t, name+"'s backlog empty", func() bool { return b.inst.Backlog(t, name) == 0 })
}

// failures returns consumer name's failure store, oldest first.
func (b *bundle) failures(t *testing.T, c *inbox.Consumer[pgx.Tx], f idem.FailedFilter) []idem.FailedMessage {
	t.Helper()
	f.Oldest = true
	fm, err := c.Failures().List(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	return fm
}

// tape records the deliveries a consumer handled or parked.
type tape struct {
	mu sync.Mutex
	ds []broker.Delivery
}

func (tp *tape) wrap(next broker.DeliverFunc) broker.DeliverFunc {
	return func(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		disps, errs := next(ctx, ds)
		tp.mu.Lock()
		defer tp.mu.Unlock()
		for i, d := range ds {
			if errs[i] == nil {
				tp.ds = append(tp.ds, d)
			}
		}
		return disps, errs
	}
}

// of returns the deliveries of event id, in order.
func (tp *tape) of(id uuid.UUID) []broker.Delivery {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(tp.ds), func(d broker.Delivery) bool { return d.Message.EventID != id })
}

// attempts returns the attempt numbers event id was delivered with.
func (tp *tape) attempts(id uuid.UUID) []int {
	var out []int
	for _, d := range tp.of(id) {
		out = append(out, d.Attempt)
	}
	return out
}

// source returns the source event id was received from, "" if it was not.
func (tp *tape) source(id uuid.UUID) string {
	if ds := tp.of(id); len(ds) > 0 {
		return ds[0].Source
	}
	return ""
}

// testDeliveredOnce: a message published twice, as a relay does after a
// crash between publish and mark, and sent again with Redeliver, as a
// replay or a retry from the failure store, is applied once.
func testDeliveredOnce(t *testing.T, tr Transport) {
	name := "test.order.placed.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"stock"}})
	c := b.consumer(t, "stock", fastRetry, nil)
	tp, _ := b.subscribe(t, "stock", c)
	m, other := NewMessage(t, name, "42", 1), NewMessage(t, name, "43", 2)
	Publish(t, b.inst.Publisher, m)
	Publish(t, b.inst.Publisher, m, other)
	copies := 1
	if tr.Features.PublishDeduplicates {
		copies = 0
	}
	if rd, ok := b.inst.Publisher.(broker.Redeliverer); ok {
		b.waitFor(t, "the event received", func() bool { return tp.source(m.EventID) != "" })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rd.Redeliver(ctx, tp.source(m.EventID), []idem.Message{m}); err != nil {
			t.Fatalf("Redeliver: %v", err)
		}
		copies++
	}
	b.waitFor(t, fmt.Sprintf("both events applied and %d copies skipped", copies), func() bool {
		s := c.Stats()
		return s.Applied == 2 && s.Duplicates == uint64(copies)
	})
	b.drained(t, "stock")
	if s := c.Stats(); s.Applied != 2 || s.Duplicates != uint64(copies) {
		t.Errorf("stats %+v: want 2 applied and %d duplicates", s, copies)
	}
	if n := b.pg.Count(t, "processed_event WHERE consumer_name = 'stock'"); n != 2 {
		t.Errorf("processed_event rows: %d, want 2", n)
	}
	CheckOnceInOrder(t, b.pg, "stock", []idem.Message{m, other})
}

// testRetryThenSuccess: a handler failing twice, then succeeding: the
// message comes back with its attempt increased, is applied once, and the
// retries reach this consumer only.
func testRetryThenSuccess(t *testing.T, tr Transport) {
	name := "test.order.placed.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"stock", "shipping"}})
	var calls atomic.Int32
	stock := b.consumer(t, "stock", fastRetry, func(idem.Event) error {
		if calls.Add(1) <= 2 {
			return errors.New("stock service unavailable")
		}
		return nil
	})
	shipping := b.consumer(t, "shipping", fastRetry, nil)
	stockTape, _ := b.subscribe(t, "stock", stock)
	shippingTape, _ := b.subscribe(t, "shipping", shipping)
	m := NewMessage(t, name, "42", 1)
	Publish(t, b.inst.Publisher, m)
	b.waitFor(t, "the event applied by both consumers", func() bool {
		return stock.Stats().Applied == 1 && shipping.Stats().Applied == 1
	})
	b.drained(t, "stock")
	b.drained(t, "shipping")
	if got := stockTape.attempts(m.EventID); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("attempts delivered to stock: %v, want [1 2 3]", got)
	}
	for _, d := range stockTape.of(m.EventID) {
		if !bytes.Equal(d.Message.Body, m.Body) || d.Message.Headers["trace"] != m.Headers["trace"] {
			t.Errorf("attempt %d delivered body %s, headers %v; want the message as published", d.Attempt, d.Message.Body, d.Message.Headers)
		}
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("stock's handler called %d times, want 3", n)
	}
	if got := shippingTape.attempts(m.EventID); !slices.Equal(got, []int{1}) {
		t.Errorf("attempts delivered to shipping: %v, want [1]: stock's retries reached it", got)
	}
	if s := shipping.Stats(); s.Applied != 1 || s.Duplicates != 0 {
		t.Errorf("shipping stats %+v: want one application and no copy of stock's retries", s)
	}
	if n := b.pg.Count(t, "failed_message"); n != 0 {
		t.Errorf("failed_message rows: %d, want 0", n)
	}
	CheckOnceInOrder(t, b.pg, "stock", []idem.Message{m})
	CheckOnceInOrder(t, b.pg, "shipping", []idem.Message{m})
}

// testAttemptsSurvive: failed attempts are counted in the consumer's
// database: a new subscriber and consumer (after a crash, a deployment or a
// rebalance) go on counting, and the message is parked at the retry
// policy's last attempt instead of starting again at 1.
func testAttemptsSurvive(t *testing.T, tr Transport) {
	name := "test.order.placed.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"stock"}})
	retry := inbox.RetryPolicy{MaxRetries: 3, InitialDelay: 50 * time.Millisecond, Jitter: -1}
	var calls atomic.Int32
	fail := func(idem.Event) error {
		calls.Add(1)
		return errors.New("no such warehouse")
	}
	Publish(t, b.inst.Publisher, NewMessage(t, name, "42", 1))
	_, stop := b.subscribe(t, "stock", b.consumer(t, "stock", retry, fail))
	b.waitFor(t, "two failed attempts", func() bool { return calls.Load() >= 2 })
	stop()
	b.subscribe(t, "stock", b.consumer(t, "stock", retry, fail))
	b.waitFor(t, "the message parked", func() bool { return b.pg.Count(t, "failed_message") == 1 })
	b.drained(t, "stock")
	if n := calls.Load(); n != 4 {
		t.Errorf("handler called %d times across the two subscribers, want 4 (MaxRetries 3)", n)
	}
	if n := b.pg.Count(t, "failed_message WHERE attempts = 4"); n != 1 {
		t.Errorf("parked with attempts other than 4")
	}
}

// testParkMalformed: bodies no decoder reads, published by a producer that
// knows nothing of idem, are parked at once, byte for byte with their
// headers, never retried, and the queue flows on.
func testParkMalformed(t *testing.T, tr Transport) {
	name := "test.order.placed.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"stock"}})
	c := b.consumer(t, "stock", fastRetry, nil)
	b.subscribe(t, "stock", c)
	bodies := [][]byte{
		[]byte("not json \xff"),
		[]byte(`{"event_name":"test.order.placed.v1","payload":{}}`),
		{0, 'b', 'i', 'n', 0, 0xfe, 0xff, '\\', ' '},
	}
	for _, body := range bodies {
		b.inst.PublishRaw(t, name, body, map[string]string{"origin": "legacy"})
	}
	good := NewMessage(t, name, "1", 1)
	Publish(t, b.inst.Publisher, good)
	b.waitFor(t, "three parked and one applied", func() bool {
		s := c.Stats()
		return s.Parked == 3 && s.Applied == 1
	})
	b.drained(t, "stock")
	fm := b.failures(t, c, idem.FailedFilter{Consumer: "stock"})
	if len(fm) != len(bodies) {
		t.Fatalf("failed messages: %d, want %d", len(fm), len(bodies))
	}
	stored := map[string]bool{}
	for _, m := range fm {
		stored[string(m.Body)] = true
		if m.Attempts != 1 || m.Headers["origin"] != "legacy" || !strings.Contains(m.Error, "undecodable") || m.Source == "" {
			t.Errorf("parked %q: attempts %d, headers %v, source %q, error %q; want 1 attempt, origin legacy, a source and an undecodable error",
				m.Body, m.Attempts, m.Headers, m.Source, m.Error)
		}
	}
	for _, body := range bodies {
		if !stored[string(body)] {
			t.Errorf("raw body %q not stored byte for byte", body)
		}
	}
	if s := c.Stats(); s.Parked != 3 || s.Failed != 0 {
		t.Errorf("stats once drained: %+v (a requeue loop would park or fail again)", s)
	}
	CheckOnceInOrder(t, b.pg, "stock", []idem.Message{good})
}

// testDebeziumInput: a message as Debezium's Outbox Event Router sends it,
// the event id and name in headers and the bare payload as body, is
// applied like an envelope. Its "id" header is the outbox row's id as
// written: one that is not a UUID (Debezium's article calls its events
// E42) is applied under the UUID idem.EventID derives from it, the id the
// relays publish the same row under, and a second copy is a duplicate.
func testDebeziumInput(t *testing.T, tr Transport) {
	name := "test.order.placed.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"stock"}})
	c := b.consumer(t, "stock", fastRetry, nil)
	b.subscribe(t, "stock", c)
	id := idem.NewEventID()
	textID := "E42-" + uuid.NewString()[:8]
	derived, err := idem.EventID(textID)
	if err != nil {
		t.Fatal(err)
	}
	headers := func(id string) map[string]string {
		return map[string]string{idem.HeaderEventID: id, idem.HeaderEventType: name}
	}
	b.inst.PublishRaw(t, name, []byte(`{"orderId":"42"}`), headers(id.String()))
	b.inst.PublishRaw(t, name, []byte(`{"orderId":"43"}`), headers(textID))
	b.inst.PublishRaw(t, name, []byte(`{"orderId":"43"}`), headers(textID))
	b.waitFor(t, "the three messages handled", func() bool {
		s := c.Stats()
		return s.Applied+s.Duplicates+s.Parked == 3
	})
	b.drained(t, "stock")
	if s := c.Stats(); s.Applied != 2 || s.Duplicates != 1 || s.Parked != 0 {
		t.Errorf("stats %+v: want 2 applied, 1 duplicate, nothing parked", s)
	}
	for _, want := range []uuid.UUID{id, derived} {
		if n := b.pg.Count(t, "effect WHERE event_id = $1", want); n != 1 {
			t.Errorf("effects of %s: %d, want 1", want, n)
		}
	}
}

// testParkedThenRedriven: a message failing on every attempt is parked
// after the retry policy's attempts, as received, with its source; a later
// message of its aggregate is parked behind it (held by it); the other
// messages flow, and another consumer applies them all. Then, with
// Features.Redeliver, the cause is fixed and both are sent back with
// Redeliver as "idem failed retry" does (marked with idem.HeaderRedrive,
// the held one after): the consumer applies them in order and empties its
// failure store, and the other consumer applies nothing twice. Without it,
// the publisher must not claim to be a broker.Redeliverer.
func testParkedThenRedriven(t *testing.T, tr Transport) {
	name := "test.order.placed.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"stock", "shipping"}})
	bad, later := NewMessage(t, name, "13", 0), NewMessage(t, name, "13", 1)
	bad.Headers["traceparent"] = "00-abc-def-01"
	var fixed atomic.Bool
	stock := b.consumer(t, "stock", fastRetry, func(ev idem.Event) error {
		if ev.ID == bad.EventID && !fixed.Load() {
			return errors.New("no such warehouse")
		}
		return nil
	})
	shipping := b.consumer(t, "shipping", fastRetry, nil)
	tp, _ := b.subscribe(t, "stock", stock)
	b.subscribe(t, "shipping", shipping)
	var good []idem.Message
	for i := range 20 {
		good = append(good, NewMessage(t, name, "g"+strconv.Itoa(i), i))
	}
	Publish(t, b.inst.Publisher, bad, later)
	Publish(t, b.inst.Publisher, good...)
	b.waitFor(t, "the good events applied, the bad one parked and the later one held", func() bool {
		s := stock.Stats()
		return s.Applied == 20 && s.Parked == 2 && shipping.Stats().Applied == 22
	})
	b.drained(t, "stock")
	fm := b.failures(t, stock, idem.FailedFilter{Consumer: "stock"})
	if len(fm) != 2 {
		t.Fatalf("failed messages: %d, want 2", len(fm))
	}
	m := fm[0]
	if m.EventID != bad.EventID || m.Attempts != 4 || !bytes.Equal(m.Body, bad.Body) || string(m.Key) != "13" ||
		m.Headers["traceparent"] != "00-abc-def-01" || m.Source != tp.source(bad.EventID) || m.Source == "" ||
		m.HeldBy != 0 || !strings.Contains(m.Error, "no such warehouse") {
		t.Fatalf("parked: event %s attempts %d key %q headers %v source %q held by %d error %q body %s; want %s, 4 attempts, key 13, its headers, source %q, not held",
			m.EventID, m.Attempts, m.Key, m.Headers, m.Source, m.HeldBy, m.Error, m.Body, bad.EventID, tp.source(bad.EventID))
	}
	if fm[1].EventID != later.EventID || fm[1].HeldBy != m.ID {
		t.Fatalf("later event of the aggregate: %s held by %d; want %s held by %d", fm[1].EventID, fm[1].HeldBy, later.EventID, m.ID)
	}
	CheckOnceInOrder(t, b.pg, "stock", good)

	rd, ok := b.inst.Publisher.(broker.Redeliverer)
	if ok != tr.Features.Redeliver {
		t.Fatalf("the publisher (%T) is a broker.Redeliverer: %v; Features.Redeliver: %v", b.inst.Publisher, ok, tr.Features.Redeliver)
	}
	if !ok {
		return
	}
	fixed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, m := range fm {
		headers := map[string]string{idem.HeaderRedrive: strconv.FormatInt(m.ID, 10)}
		for k, v := range m.Headers {
			headers[k] = v
		}
		msg := idem.Message{EventID: m.EventID, EventName: m.EventName, Key: m.Key, Headers: headers, Body: m.Body}
		if err := rd.Redeliver(ctx, m.Source, []idem.Message{msg}); err != nil {
			t.Fatalf("Redeliver %s to %s: %v", m.EventID, m.Source, err)
		}
	}
	b.waitFor(t, "the re-driven messages applied and the failure store empty", func() bool {
		return stock.Stats().Applied == 22 && b.pg.Count(t, "failed_message") == 0
	})
	b.drained(t, "stock")
	b.drained(t, "shipping")
	CheckOnceInOrder(t, b.pg, "stock", append(good, bad, later))
	if tr.Features.RedeliverReachesAll {
		b.waitFor(t, "shipping skipped the two copies", func() bool { return shipping.Stats().Duplicates == 2 })
	} else if s := shipping.Stats(); s.Duplicates != 0 {
		t.Errorf("shipping received %d of stock's re-driven messages, want none", s.Duplicates)
	}
	CheckOnceInOrder(t, b.pg, "shipping", append([]idem.Message{bad, later}, good...))
}

// testDeadLetter: a message still failing after Options.DeadLetterAfter
// attempts goes, as received, to the dead-letter destination, not to the
// failure store, and the others flow.
func testDeadLetter(t *testing.T, tr Transport) {
	name := "test.order.placed.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"stock"}, DeadLetterAfter: 2})
	var msgs []idem.Message
	for i := range 5 {
		msgs = append(msgs, NewMessage(t, name, strconv.Itoa(i), i))
	}
	bad := msgs[2]
	c := b.consumer(t, "stock", inbox.RetryPolicy{MaxRetries: 10, InitialDelay: time.Millisecond, Jitter: -1}, func(ev idem.Event) error {
		if ev.ID == bad.EventID {
			return errors.New("always failing")
		}
		return nil
	})
	b.subscribe(t, "stock", c)
	Publish(t, b.inst.Publisher, msgs...)
	var dead []idem.Message
	b.waitFor(t, "the failing message dead-lettered and the others applied", func() bool {
		dead = b.inst.DeadLetters(t, "stock")
		return len(dead) >= 1 && c.Stats().Applied == 4
	})
	b.drained(t, "stock")
	if len(dead) != 1 || dead[0].EventID != bad.EventID || !bytes.Equal(dead[0].Body, bad.Body) || string(dead[0].Key) != string(bad.Key) {
		t.Errorf("dead letters %+v: want the failing message %s as received", dead, bad.EventID)
	}
	if n := b.pg.Count(t, "failed_message"); n != 0 {
		t.Errorf("failed_message rows: %d, want 0", n)
	}
	CheckOnceInOrder(t, b.pg, "stock", slices.Delete(slices.Clone(msgs), 2, 3))
}

// testRestart: messages confirmed before a broker restart are kept, for a
// consumer that was away and for one that runs through the restart, which
// resumes by itself; the publisher works again; messages acknowledged
// before the restart do not come back.
func testRestart(t *testing.T, tr Transport) {
	if tr.Features.Exclusive != nil {
		tr.Features.Exclusive(t)
	}
	name := "test.thing.kept.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"away", "running"}})
	var msgs []idem.Message
	for i := range 100 {
		msgs = append(msgs, NewMessage(t, name, strconv.Itoa(i%3), i))
	}
	// "away" consumes the first ten, then stops.
	away := b.consumer(t, "away", fastRetry, nil)
	_, stop := b.subscribe(t, "away", away)
	Publish(t, b.inst.Publisher, msgs[:10]...)
	b.waitFor(t, "the first ten applied", func() bool { return away.Stats().Applied == 10 })
	stop()
	running := b.consumer(t, "running", fastRetry, nil)
	b.subscribe(t, "running", running)
	Publish(t, b.inst.Publisher, msgs[10:]...)
	b.waitFor(t, "every message applied before the restart", func() bool { return running.Stats().Applied == 100 })

	tr.Features.Restart(t)
	// A publisher that lived through the restart must work again (it may
	// fail while reconnecting: retry with a deadline).
	extra := NewMessage(t, name, "x", 100)
	deadline := time.Now().Add(tr.Features.Timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := b.inst.Publisher.Publish(ctx, []idem.Message{extra})
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
	b.waitFor(t, "the running subscriber resumed", func() bool { return running.Stats().Applied == 101 })
	back := b.consumer(t, "away", fastRetry, nil)
	b.subscribe(t, "away", back)
	b.waitFor(t, "the messages kept for the consumer that was away", func() bool { return back.Stats().Applied == 91 })
	b.drained(t, "away")
	b.drained(t, "running")
	if s := back.Stats(); s.Duplicates != 0 {
		t.Errorf("%d messages acknowledged before the restart delivered again", s.Duplicates)
	}
	CheckOnceInOrder(t, b.pg, "away", msgs)
	CheckOnceInOrder(t, b.pg, "running", msgs)
}
