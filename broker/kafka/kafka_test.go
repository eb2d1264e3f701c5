package kafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// readAll reads n records from the start of topic with a plain client.
func readAll(t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s: got %d records, want %d", topic, len(out), n)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

func header(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

func TestPublisherWireFormat(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3, "outbox.event.order", "orders.raw", "shop.order.order.placed.v1")
	ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]any{"orderId": 42})
	if err != nil {
		t.Fatal(err)
	}
	ev.Headers = map[string]string{"trace": "abc"}
	msg, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	if err := newPublisher(t, c).Publish(ctx, []idem.Message{msg}); err != nil {
		t.Fatal(err)
	}
	r := readAll(t, c, "outbox.event.order", 1)[0]
	if string(r.Key) != "42" || header(r, "id") != ev.ID.String() || header(r, "eventType") != ev.Name ||
		header(r, "trace") != "abc" || string(r.Value) != string(msg.Body) {
		t.Errorf("record = key %q headers %v value %s; want key 42, id, eventType, trace and the envelope", r.Key, r.Headers, r.Value)
	}

	// Debezium's value format: the bare payload.
	deb := newPublisher(t, c, func(cfg *kafka.PublisherConfig) {
		cfg.ValueFormat = kafka.DebeziumPayload
		cfg.TopicReplacement = "orders.raw"
	})
	if err := deb.Publish(ctx, []idem.Message{msg}); err != nil {
		t.Fatal(err)
	}
	r = readAll(t, c, "orders.raw", 1)[0]
	if string(r.Value) != `{"orderId":42}` || header(r, "id") != ev.ID.String() {
		t.Errorf("Debezium record value %s, id %q", r.Value, header(r, "id"))
	}
	got, err := idem.Decode(idem.Message{Key: r.Key, Headers: map[string]string{"id": header(r, "id"), "eventType": header(r, "eventType")}, Body: r.Value})
	if err != nil || got.ID != ev.ID || got.Name != ev.Name || got.AggregateID != "42" {
		t.Errorf("Debezium record decodes to %+v, %v", got, err)
	}

	// Routing by event type with a replacement, as route.by.field=type.
	byType := newPublisher(t, c, func(cfg *kafka.PublisherConfig) {
		cfg.RouteByField = kafka.RouteByEventType
		cfg.TopicReplacement = "shop.${routedByValue}"
	})
	if err := byType.Publish(ctx, []idem.Message{msg}); err != nil {
		t.Fatal(err)
	}
	readAll(t, c, "shop.order.order.placed.v1", 1)

	// Per-message errors: a message without aggregate type fails alone.
	bad := msg
	bad.AggregateType = ""
	err = newPublisher(t, c).Publish(ctx, []idem.Message{msg, bad})
	var be *broker.BatchError
	if !errors.As(err, &be) || len(be.Errs) != 2 || be.Errs[0] != nil || be.Errs[1] == nil {
		t.Fatalf("Publish with one unroutable message: %v, want a BatchError for the second only", err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	if _, err := kafka.NewPublisher(kafka.PublisherConfig{}); err == nil || !strings.Contains(err.Error(), "Brokers") {
		t.Errorf("NewPublisher without brokers: %v", err)
	}
	if _, err := kafka.NewPublisher(kafka.PublisherConfig{ClientConfig: kafka.ClientConfig{Brokers: []string{"x:1"}}, TopicReplacement: "bad topic"}); err == nil || !strings.Contains(err.Error(), "TopicReplacement") {
		t.Errorf("NewPublisher with a bad topic: %v", err)
	}
	noop := func(context.Context, []inbox.Delivery) ([]inbox.Disposition, []error) { return nil, nil }
	cc := kafka.ClientConfig{Brokers: []string{"x:1"}}
	for _, tc := range []struct {
		cfg  kafka.SubscriberConfig
		want string
	}{
		{kafka.SubscriberConfig{ClientConfig: cc, Topics: []string{"t"}}, "Group"},
		{kafka.SubscriberConfig{ClientConfig: cc, Group: "g"}, "Topics"},
		{kafka.SubscriberConfig{ClientConfig: cc, Group: "g", Topics: []string{"t"}, BatchSize: -1}, "BatchSize"},
		{kafka.SubscriberConfig{ClientConfig: cc, Group: "g", Topics: []string{"t"}, BatchSize: 10, MaxBuffered: 5}, "MaxBuffered"},
	} {
		if _, err := kafka.NewSubscriber(tc.cfg, noop); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewSubscriber(%+v): %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}

// callLog records what a DeliverFunc saw, call by call.
type callLog struct {
	mu    sync.Mutex
	calls int
	recs  []logged
}

type logged struct {
	call      int
	source    string
	n         int
	key       string
	id        uuid.UUID
	attempt   int
	outcome   inbox.Outcome
	action    inbox.Action
	committed int64 // the partition's committed offset when delivered
}

// wrap logs the calls to next. sub is set once the subscriber is started:
// until then the committed offsets are not read.
func (l *callLog) wrap(sub *atomic.Pointer[kafka.Subscriber], next broker.DeliverFunc) broker.DeliverFunc {
	return func(ctx context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
		before := map[string]int64{}
		if s := sub.Load(); s != nil {
			for _, p := range s.Stats().Partitions {
				before[fmt.Sprintf("%s/%d", p.Topic, p.Partition)] = p.Committed
			}
		}
		disps, errs := next(ctx, ds)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls++
		for i, d := range ds {
			var p struct{ Payload struct{ N int } }
			_ = json.Unmarshal(d.Message.Body, &p)
			l.recs = append(l.recs, logged{call: l.calls, source: d.Source, n: p.Payload.N, key: string(d.Message.Key),
				id: d.Message.EventID, attempt: d.Attempt, outcome: disps[i].Outcome, action: disps[i].Action, committed: before[d.Source]})
		}
		return disps, errs
	}
}

func (l *callLog) snapshot() []logged {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]logged(nil), l.recs...)
}

// A record failing in the middle of a partition holds that partition (its
// later records wait, the committed offset stays before it) while the other
// partitions go on; once parked, the partition resumes.
func TestFailingMidPartition(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	c := newCluster(t, 4, topic)
	pg := testdb.NewPostgres(t)
	evs := newEvents(t, 400, 40)
	if err := newPublisher(t, c).Publish(context.Background(), messages(t, evs)); err != nil {
		t.Fatal(err)
	}
	// Where each event landed.
	type pos struct {
		partition int32
		offset    int64
	}
	where := map[uuid.UUID]pos{}
	for _, r := range readAll(t, c, topic, len(evs)) {
		id, _ := uuid.Parse(header(r, "id"))
		where[id] = pos{r.Partition, r.Offset}
	}
	bad := evs[201]
	badPos := where[bad.ID]
	badSource := fmt.Sprintf("%s/%d", topic, badPos.partition)
	others := 0
	for _, ev := range evs {
		if where[ev.ID].partition != badPos.partition {
			others++
		}
	}
	var othersDone atomic.Int64
	var badDeliveries atomic.Int64
	cons := effectConsumer(t, pg, "mid", inbox.RetryPolicy{MaxRetries: 1000, InitialDelay: 20 * time.Millisecond, Multiplier: 1, Jitter: -1},
		func(ev idem.Event) error {
			if ev.ID != bad.ID {
				return nil
			}
			// Fail on the first delivery, and until every record of the
			// other partitions is handled (they may all be done before the
			// bad record's partition is even fetched), then fail for good:
			// the record is parked.
			if badDeliveries.Load() > 1 && othersDone.Load() >= int64(others) {
				return idem.Permanent(errors.New("bad record"))
			}
			return errors.New("not yet")
		})
	var log callLog
	var sub atomic.Pointer[kafka.Subscriber]
	logged := log.wrap(&sub, cons.DeliverBatch)
	deliver := func(ctx context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
		for _, d := range ds {
			if d.Message.EventID == bad.ID {
				badDeliveries.Add(1)
			}
		}
		disps, errs := logged(ctx, ds)
		for i, d := range ds {
			if d.Source != badSource && errs[i] == nil && disps[i].Action == inbox.Ack {
				othersDone.Add(1)
			}
		}
		return disps, errs
	}
	started, _ := subscribe(t, c, "mid", []string{topic}, deliver, func(cfg *kafka.SubscriberConfig) { cfg.BatchSize = 10 })
	sub.Store(started)
	// The later records of the failing record's aggregate are parked
	// behind it (it holds its aggregate), the others applied.
	var applied, held []idem.Event
	for i, ev := range evs {
		switch {
		case i == 201:
		case i > 201 && ev.AggregateID == bad.AggregateID:
			held = append(held, ev)
		default:
			applied = append(applied, ev)
		}
	}
	testsvc.WaitFor(t, 30*time.Second, "every event applied or parked", func() bool {
		return pg.Count(t, "effect") == len(applied) && cons.Stats().Parked == uint64(1+len(held))
	})
	testsvc.WaitFor(t, 10*time.Second, "offsets committed to the end", func() bool {
		var lag int64
		st := started.Stats()
		for _, p := range st.Partitions {
			lag += max(p.Lag, 0)
		}
		return lag == 0 && len(st.Partitions) == 4
	})

	recs := log.snapshot()
	parkCall, firstBadCall, attempts := 0, 0, 0
	for _, r := range recs {
		if r.id == bad.ID {
			attempts++
			if firstBadCall == 0 {
				firstBadCall = r.call
			}
			if r.outcome == inbox.Parked {
				parkCall = r.call
			}
			if r.committed > badPos.offset {
				t.Errorf("attempt %d of the failing record (offset %d): committed offset already %d", r.attempt, badPos.offset, r.committed)
			}
		}
	}
	if parkCall == 0 || attempts < 2 {
		t.Fatalf("failing record: %d attempts, parked in call %d", attempts, parkCall)
	}
	for _, r := range recs {
		p := where[r.id]
		if p.partition == badPos.partition && p.offset > badPos.offset && r.call < parkCall && r.action == inbox.Ack {
			// Only records of other keys delivered in the same call as the
			// failing record's first attempt may be handled before it.
			if r.call != firstBadCall || r.key == bad.AggregateID {
				t.Errorf("record at offset %d (key %s) of the failing partition handled in call %d, before the failing record was parked (call %d)",
					p.offset, r.key, r.call, parkCall)
			}
		}
	}
	if n := pg.Count(t, "failed_message WHERE event_id = $1", bad.ID); n != 1 {
		t.Errorf("failed_message rows for the failing record: %d", n)
	}
	ends := map[int32]int64{}
	for _, ev := range evs {
		p := where[ev.ID]
		ends[p.partition] = max(ends[p.partition], p.offset+1)
	}
	for p, off := range committed(t, c, "mid", topic) {
		if off != ends[p] {
			t.Errorf("partition %d: committed %d, end %d", p, off, ends[p])
		}
	}
	if n := pg.Count(t, "failed_message WHERE held_by IS NOT NULL"); n != len(held) {
		t.Errorf("%d records parked behind the failing one, want %d", n, len(held))
	}
	checkOnceInOrder(t, pg, "mid", applied)
}

// Debezium Outbox Event Router records (header id, key, bare payload or a
// JSON string holding it) are consumed like envelopes.
func TestDebeziumInput(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	c := newCluster(t, 2, topic)
	pg := testdb.NewPostgres(t)
	var mu sync.Mutex
	got := map[uuid.UUID]idem.Event{}
	cons := effectConsumer(t, pg, "debezium", inbox.RetryPolicy{}, func(ev idem.Event) error {
		mu.Lock()
		got[ev.ID] = ev
		mu.Unlock()
		return nil
	})
	ids := []uuid.UUID{idem.NewEventID(), idem.NewEventID(), idem.NewEventID()}
	recs := []*kgo.Record{
		{Topic: topic, Key: []byte("42"), Value: []byte(`{"orderId":42}`), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(ids[0].String())}, {Key: "eventType", Value: []byte("OrderCreated")}}},
		{Topic: topic, Key: []byte(`"43"`), Value: []byte(`"{\"orderId\":43}"`), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(ids[1].String())}, {Key: "eventType", Value: []byte("OrderCreated")}}},
		{Topic: topic, Key: []byte("44"), Value: []byte(`{"schema":{"type":"string"},"payload":"{\"orderId\":44}"}`), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(ids[2].String())}}},
	}
	produce(t, c.ListenAddrs(), recs...)
	// The third record has no eventType header: it is parked, with its id and
	// aggregate, never acknowledged as ignored.
	subscribe(t, c, "debezium", []string{topic}, cons.DeliverBatch)
	testsvc.WaitFor(t, 30*time.Second, "two Debezium records applied and one parked", func() bool {
		return pg.Count(t, "effect") == 2 && pg.Count(t, "failed_message") == 1
	})
	var parkedID, parkedErr, parkedKey string
	if err := pg.DB.QueryRow(`SELECT event_id::text, error, convert_from(message_key, 'UTF8') FROM failed_message`).Scan(&parkedID, &parkedErr, &parkedKey); err != nil {
		t.Fatal(err)
	}
	if parkedID != ids[2].String() || parkedKey != "44" || !strings.Contains(parkedErr, "eventType") {
		t.Errorf("parked record: id %s key %s error %q; want %s, 44 and a missing eventType", parkedID, parkedKey, parkedErr, ids[2])
	}
	mu.Lock()
	for i, want := range []string{"42", "43"} {
		ev := got[ids[i]]
		if ev.AggregateID != want || ev.AggregateType != "order" || string(ev.Payload) != `{"orderId":`+want+`}` {
			t.Errorf("record %d decoded as %+v (payload %s)", i, ev, ev.Payload)
		}
	}
	if got[ids[0]].Name != "OrderCreated" {
		t.Errorf("eventType header not used: %q", got[ids[0]].Name)
	}
	mu.Unlock()

	// With a default event name for the topic, a record without eventType
	// takes it.
	other := effectConsumer(t, pg, "debezium-default", inbox.RetryPolicy{}, nil)
	subscribe(t, c, "debezium-default", []string{topic}, other.DeliverBatch, func(cfg *kafka.SubscriberConfig) {
		cfg.DefaultEventNames = map[string]string{topic: "OrderCreated"}
	})
	testsvc.WaitFor(t, 30*time.Second, "three records applied with the default name", func() bool {
		return other.Stats().Applied == 3
	})
}

// A consumer joins and another leaves while events are handled: every event
// is applied once, each aggregate in order.
func TestRebalanceWhileHandling(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	c := newCluster(t, 6, topic)
	pg := testdb.NewPostgres(t)
	evs := newEvents(t, 3000, 60)
	cons := effectConsumer(t, pg, "rebalance", inbox.RetryPolicy{}, nil)
	tweak := func(cfg *kafka.SubscriberConfig) { cfg.BatchSize = 20 }
	_, stopA := subscribe(t, c, "rebalance", []string{topic}, cons.DeliverBatch, tweak)
	pub := newPublisher(t, c)
	msgs := messages(t, evs)
	pubErr := make(chan error, 1)
	go func() {
		for i := 0; i < len(msgs); i += 100 {
			if err := pub.Publish(context.Background(), msgs[i:i+100]); err != nil {
				pubErr <- err
				return
			}
		}
		pubErr <- nil
	}()
	applied := func() int { return pg.Count(t, "effect") }
	testsvc.WaitFor(t, 30*time.Second, "some events applied", func() bool { return applied() >= 300 })
	subscribe(t, c, "rebalance", []string{topic}, cons.DeliverBatch, tweak) // B joins
	testsvc.WaitFor(t, 30*time.Second, "more events applied", func() bool { return applied() >= 1500 })
	stopA() // A leaves
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 60*time.Second, "every event applied", func() bool { return applied() >= len(evs) })
	checkOnceInOrder(t, pg, "rebalance", evs)
}
