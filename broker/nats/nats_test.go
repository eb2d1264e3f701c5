package nats_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

func TestConformance(t *testing.T) {
	srv := startServer(t)
	brokertest.Run(t, brokertest.Transport{
		New: func(t *testing.T, o brokertest.Options) brokertest.Instance {
			n := newNames()
			pub := newPublisher(t, srv.url(), n.stream)
			consumer := "c" + randomHex(4)
			return brokertest.Instance{
				Publisher: pub,
				Subscribe: func(t *testing.T, deliver broker.DeliverFunc) func() {
					return subscribe(t, srv.url(), n.stream, consumer, broker.DeliverFunc(deliver),
						func(c *nats.SubscriberConfig) { c.Workers = 1 })
				},
			}
		},
		Features: brokertest.Features{Restart: func(t *testing.T) { srv.restart(t) }},
	})
}

func TestPublishHeadersAndSubject(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	pub := newPublisher(t, srv.url(), n.stream)
	m := newMessage(t, "order.order.placed.v1", "42")
	m.Headers = map[string]string{"traceparent": "00-abc-def-01"}
	publishAll(t, pub, m)

	js, err := jetstream.New(pub.Conn())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, n.stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetLastMsgForSubject(ctx, n.stream.SubjectPrefix+".order.order.placed.v1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Nats-Msg-Id":            m.EventID.String(),
		idem.HeaderEventID:       m.EventID.String(),
		idem.HeaderEventType:     "order.order.placed.v1",
		nats.HeaderKey:           "42",
		nats.HeaderAggregateType: "order",
		"traceparent":            "00-abc-def-01",
	}
	for k, v := range want {
		if got := raw.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if !bytes.Equal(raw.Data, m.Body) {
		t.Errorf("body = %s, want %s", raw.Data, m.Body)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Duplicates != nats.DuplicatesDefault || info.Config.Storage != jetstream.FileStorage {
		t.Errorf("stream config: duplicates %v storage %v", info.Config.Duplicates, info.Config.Storage)
	}
	// Within the duplicate window, the same event id is acknowledged and
	// dropped by JetStream.
	publishAll(t, pub, m)
	if info, err = stream.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Errorf("messages after publishing the same event twice: %d (%v), want 1", info.State.Msgs, err)
	}
}

func TestPublishReportsEachMessage(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	pub := newPublisher(t, srv.url(), n.stream)
	good := newMessage(t, "order.order.placed.v1", "1")
	spaced := newMessage(t, "order.order.placed.v1", "2")
	spaced.EventName = "order order placed"
	wild := newMessage(t, "order.order.placed.v1", "3")
	wild.EventName = "order.*.placed.v1"
	empty := newMessage(t, "order.order.placed.v1", "4")
	empty.EventName = "order..placed"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := pub.Publish(ctx, []idem.Message{good, spaced, wild, empty})
	errs := broker.Results(err, 4)
	if errs[0] != nil {
		t.Errorf("good message: %v", errs[0])
	}
	for i, want := range []string{"whitespace", "wildcard", "empty token"} {
		if errs[i+1] == nil || !strings.Contains(errs[i+1].Error(), want) {
			t.Errorf("message %d: error %v, want one mentioning %q", i+1, errs[i+1], want)
		}
	}

	// No stream captures other subjects: unroutable.
	other := newNames()
	p2, err := nats.NewPublisher(ctx, nats.PublisherConfig{
		ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: other.stream, NoDeclare: true, AckTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	err = p2.Publish(ctx, []idem.Message{good})
	if !errors.Is(err, broker.ErrUnroutable) {
		t.Errorf("publish with no stream: %v, want ErrUnroutable", err)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	deliver := func(context.Context, []inbox.Delivery) ([]inbox.Disposition, []error) { return nil, nil }
	cases := []struct {
		cfg  nats.SubscriberConfig
		want string
	}{
		{nats.SubscriberConfig{Consumer: "stock"}, "URL is required"},
		{nats.SubscriberConfig{ConnConfig: nats.ConnConfig{URL: "nats://x"}}, "Consumer"},
		{nats.SubscriberConfig{ConnConfig: nats.ConnConfig{URL: "nats://x"}, Consumer: "stock.v1"}, "dots"},
		{nats.SubscriberConfig{ConnConfig: nats.ConnConfig{URL: "nats://x"}, Consumer: "stock", Bindings: []string{"order.>.x"}}, "Bindings"},
		{nats.SubscriberConfig{ConnConfig: nats.ConnConfig{URL: "nats://x"}, Consumer: "stock", MaxDeliver: -2}, "MaxDeliver"},
	}
	for _, c := range cases {
		_, err := nats.NewSubscriber(c.cfg, deliver)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one mentioning %q", c.cfg, err, c.want)
		}
	}
	got := nats.SubscriberConfig{Consumer: "stock", Bindings: []string{"order.>", "billing.invoice.*.v1"}}.FilterSubjects()
	want := []string{"events.order.>", "events.billing.invoice.*.v1", "events-retry.stock.>"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("filter subjects %v, want %v", got, want)
	}
}

func TestDeliveredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, "stock", c.DeliverBatch)
	m := newMessage(t, "order.order.placed.v1", "42")
	other := newMessage(t, "order.order.placed.v1", "43")
	publishAll(t, b.pub, m, other)
	eventually(t, 30*time.Second, "both events applied", func() bool { return c.Stats().Applied == 2 })
	// A copy JetStream's duplicate window does not catch (a replay, a
	// retry from the failure store) is skipped by the consumer.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.pub.Redeliver(ctx, "stock", []idem.Message{m}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the copy skipped", func() bool { return c.Stats().Duplicates == 1 })
	if n := b.pg.Count(t, "effect WHERE event_id = $1", m.EventID); n != 1 {
		t.Fatalf("effects of the twice-delivered event: %d, want 1", n)
	}
}

func TestRetryThenSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls counter
	var mu sync.Mutex
	var attempts []int
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, func(ev idem.Event) error {
		if calls.inc(ev.ID) <= 2 {
			return errors.New("stock service unavailable")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, "stock", func(ctx context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
		mu.Lock()
		for _, d := range ds {
			attempts = append(attempts, d.Attempt)
		}
		mu.Unlock()
		return c.DeliverBatch(ctx, ds)
	})
	var shippingApplied sync.WaitGroup
	shipping, err := newEffectConsumer(b.pg.Driver, "shipping", fastRetry, nil)
	if err != nil {
		t.Fatal(err)
	}
	shippingApplied.Add(0)
	b.subscribe(t, "shipping", shipping.DeliverBatch)
	publishAll(t, b.pub, newMessage(t, "order.order.placed.v1", "42"))
	eventually(t, 30*time.Second, "the event applied", func() bool { return c.Stats().Applied == 1 })
	mu.Lock()
	got := fmt.Sprint(attempts)
	mu.Unlock()
	if got != "[1 2 3]" {
		t.Errorf("attempts %s, want [1 2 3] (JetStream's delivery count)", got)
	}
	eventually(t, 30*time.Second, "shipping applied", func() bool { return shipping.Stats().Applied == 1 })
	if s := shipping.Stats(); s.Duplicates != 0 {
		t.Errorf("shipping saw stock's retries: %+v", s)
	}
	if n := b.pg.Count(t, "failed_message"); n != 0 {
		t.Errorf("failed_message rows: %d, want 0", n)
	}
}

func TestAlwaysFailingIsParkedThenRetriedToOneConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := newMessage(t, "order.order.placed.v1", "13")
	var broken sync.Mutex
	fixed := false
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, func(ev idem.Event) error {
		broken.Lock()
		defer broken.Unlock()
		if ev.ID == bad.EventID && !fixed {
			return errors.New("no such warehouse")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	shipping, err := newEffectConsumer(b.pg.Driver, "shipping", fastRetry, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, "stock", c.DeliverBatch)
	b.subscribe(t, "shipping", shipping.DeliverBatch)
	var good []idem.Message
	for i := range 20 {
		good = append(good, newMessage(t, "order.order.placed.v1", fmt.Sprint("g", i)))
	}
	publishAll(t, b.pub, bad)
	publishAll(t, b.pub, good...)
	eventually(t, 30*time.Second, "good events applied and the bad one parked", func() bool {
		s := c.Stats()
		return s.Applied == 20 && s.Parked == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fm, err := c.Failures().List(ctx, idem.FailedFilter{Consumer: "stock"})
	if err != nil || len(fm) != 1 {
		t.Fatalf("failed messages: %v %v", fm, err)
	}
	if fm[0].EventID != bad.EventID || fm[0].Attempts != 4 || !bytes.Equal(fm[0].Body, bad.Body) || fm[0].Source != "stock" {
		t.Errorf("parked: event %s attempts %d source %q body %s", fm[0].EventID, fm[0].Attempts, fm[0].Source, fm[0].Body)
	}

	// The operator fixes the cause and retries the stored message: it goes
	// to stock only, although its id is still in the duplicate window.
	broken.Lock()
	fixed = true
	broken.Unlock()
	retry := idem.Message{EventID: fm[0].EventID, EventName: fm[0].EventName, Key: fm[0].Key, Headers: fm[0].Headers, Body: fm[0].Body}
	if err := b.pub.Redeliver(ctx, fm[0].Source, []idem.Message{retry}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the retried message applied", func() bool { return c.Stats().Applied == 21 })
	eventually(t, 30*time.Second, "shipping applied every event", func() bool { return shipping.Stats().Applied == 21 })
	if s := shipping.Stats(); s.Duplicates != 0 {
		t.Errorf("shipping received stock's retry: %+v", s)
	}
}

func TestMalformedBodiesAreParkedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, "stock", c.DeliverBatch)
	js, err := jetstream.New(b.pub.Conn())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bodies := [][]byte{[]byte("not json \xff"), []byte(`{"event_name":"order.order.placed.v1","payload":{}}`)}
	for _, body := range bodies {
		msg := &natsgo.Msg{Subject: b.names.stream.SubjectPrefix + ".order.order.placed.v1", Data: body, Header: natsgo.Header{"origin": []string{"legacy"}}}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	publishAll(t, b.pub, newMessage(t, "order.order.placed.v1", "1"))
	eventually(t, 30*time.Second, "two parked and one applied", func() bool {
		s := c.Stats()
		return s.Parked == 2 && s.Applied == 1
	})
	fm, err := c.Failures().List(ctx, idem.FailedFilter{Consumer: "stock"})
	if err != nil || len(fm) != 2 {
		t.Fatalf("failed messages: %d %v", len(fm), err)
	}
	for _, m := range fm {
		if m.Attempts != 1 || m.Headers["origin"] != "legacy" || !strings.Contains(m.Error, "undecodable") {
			t.Errorf("parked %q: attempts %d headers %v error %q", m.Body, m.Attempts, m.Headers, m.Error)
		}
	}
}

// TestDebeziumStyleMessage checks that a message carrying the event id and
// name in headers, with a bare payload, is accepted (what a Debezium-style
// producer publishes).
func TestDebeziumStyleMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, "stock", c.DeliverBatch)
	js, err := jetstream.New(b.pub.Conn())
	if err != nil {
		t.Fatal(err)
	}
	id := idem.NewEventID()
	msg := &natsgo.Msg{
		Subject: b.names.stream.SubjectPrefix + ".order.order.placed.v1",
		Data:    []byte(`{"orderId":"42"}`),
		Header:  natsgo.Header{"id": []string{id.String()}, "eventType": []string{"order.order.placed.v1"}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(id.String())); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "applied", func() bool { return c.Stats().Applied == 1 })
	if n := b.pg.Count(t, "effect WHERE event_id = $1", id); n != 1 {
		t.Errorf("effects: %d", n)
	}
}

// TestEmbeddedRestartKeepsUndelivered stops an in-process embedded server
// with messages not yet consumed, starts a new one on the same directory,
// and receives exactly those messages.
func TestEmbeddedRestartKeepsUndelivered(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := newNames()
	var delivered sync.Map // event id -> count

	run := func(publish []idem.Message, wantIDs map[uuid.UUID]bool) {
		srv, err := embedded.Start(ctx, embedded.Config{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := srv.Shutdown(ctx); err != nil {
				t.Error(err)
			}
		}()
		nc, err := srv.Connect()
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		pub, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{Conn: nc}, Stream: n.stream})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		// The first run creates the durable consumer before publishing.
		got := make(chan uuid.UUID, 1000)
		sub, err := nats.NewSubscriber(nats.SubscriberConfig{ConnConfig: nats.ConnConfig{Conn: nc}, Stream: n.stream, Consumer: "stock"},
			func(_ context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
				out := make([]inbox.Disposition, len(ds))
				for i, d := range ds {
					v, _ := delivered.LoadOrStore(d.Message.EventID, new(int))
					*v.(*int)++
					out[i] = inbox.Disposition{Action: inbox.Ack, Outcome: inbox.Applied}
					got <- d.Message.EventID
				}
				return out, make([]error, len(ds))
			})
		if err != nil {
			t.Fatal(err)
		}
		if wantIDs != nil {
			if err := sub.Start(ctx); err != nil {
				t.Fatal(err)
			}
			for len(wantIDs) > 0 {
				select {
				case id := <-got:
					if !wantIDs[id] {
						t.Errorf("received %s, which was acknowledged before the restart", id)
					}
					delete(wantIDs, id)
				case <-ctx.Done():
					t.Fatalf("%d messages missing after the restart", len(wantIDs))
				}
			}
			if err := sub.Stop(ctx); err != nil {
				t.Error(err)
			}
			return
		}
		if err := sub.Start(ctx); err != nil {
			t.Fatal(err)
		}
		// Consume a first batch, stop, then publish what stays undelivered.
		first := publish[:10]
		if err := pub.Publish(ctx, first); err != nil {
			t.Fatal(err)
		}
		for range first {
			select {
			case <-got:
			case <-ctx.Done():
				t.Fatal("first messages not received")
			}
		}
		if err := sub.Stop(ctx); err != nil {
			t.Error(err)
		}
		if err := pub.Publish(ctx, publish[10:]); err != nil {
			t.Fatal(err)
		}
	}

	var msgs []idem.Message
	want := map[uuid.UUID]bool{}
	for i := range 60 {
		m := newMessage(t, "order.order.placed.v1", fmt.Sprint(i%4))
		msgs = append(msgs, m)
		if i >= 10 {
			want[m.EventID] = true
		}
	}
	run(msgs, nil)
	run(nil, want)
	delivered.Range(func(k, v any) bool {
		if *v.(*int) != 1 {
			t.Errorf("event %s delivered %d times", k, *v.(*int))
		}
		return true
	})
}

// TestRedeliveryAfterKillBetweenCommitAndAck kills a real consumer process
// after its transaction committed and before it acknowledged: JetStream
// delivers the message again, and the next consumer skips the duplicate.
func TestRedeliveryAfterKillBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := newMessage(t, "order.order.placed.v1", "42")
	publishAll(t, b.pub, m)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"=1",
		"IDEM_FAULT="+nats.FaultAfterHandleBeforeAck,
		"CHILD_PG_URL="+b.pg.URL,
		"CHILD_NATS_URL="+b.srv.url(),
		"CHILD_STREAM="+b.names.stream.Name,
		"CHILD_PREFIX="+b.names.stream.SubjectPrefix,
		"CHILD_CONSUMER=stock",
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(stderr.String(), "fault point "+nats.FaultAfterHandleBeforeAck) {
		t.Fatalf("child consumer: %v, want killed at the fault point; stderr:\n%s", err, stderr.String())
	}
	if n := b.pg.Count(t, "effect"); n != 1 {
		t.Fatalf("effects after the kill: %d, want 1 (committed before the crash)", n)
	}

	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, nil)
	if err != nil {
		t.Fatal(err)
	}
	var attempt sync.Map
	b.subscribe(t, "stock", func(ctx context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
		for _, d := range ds {
			attempt.Store(d.Message.EventID, d.Attempt)
		}
		return c.DeliverBatch(ctx, ds)
	}, func(c *nats.SubscriberConfig) { c.AckWait = time.Second }) // as the child's
	eventually(t, 30*time.Second, "the redelivery skipped as a duplicate", func() bool { return c.Stats().Duplicates == 1 })
	if n := b.pg.Count(t, "effect"); n != 1 {
		t.Fatalf("effects after the redelivery: %d, want 1", n)
	}
	if a, _ := attempt.Load(m.EventID); a != 2 {
		t.Errorf("attempt of the redelivery: %v, want 2", a)
	}
	if n := b.pg.Count(t, "processed_event WHERE consumer_name = 'stock'"); n != 1 {
		t.Errorf("processed_event rows: %d, want 1", n)
	}
}

// redeliverer publishes through Publisher.Redeliver, to one consumer.
type redeliverer struct {
	pub      *nats.Publisher
	consumer string
}

func (r redeliverer) Publish(ctx context.Context, msgs []idem.Message) error {
	return r.pub.Redeliver(ctx, r.consumer, msgs)
}

// TestEndToEndWithRelay commits events to an outbox, lets the relay publish
// them to JetStream and a subscriber apply them: each event once, each
// aggregate's events in commit order. A replay is then dropped by
// JetStream's duplicate window, and a replay that goes around it is skipped
// by the consumer.
func TestEndToEndWithRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b.pg.Exec(t, `CREATE TABLE applied (seq bigserial PRIMARY KEY, aggregate_id text NOT NULL, version bigint NOT NULL)`)
	c, err := inbox.New[pgx.Tx](b.pg.Driver, inbox.Config{Name: "stock", Retry: fastRetry})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle("order.order.changed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (aggregate_id, version) VALUES ($1, $2)`, ev.AggregateID, ev.AggregateVersion)
		return err
	})
	b.subscribe(t, "stock", c.DeliverBatch, func(cfg *nats.SubscriberConfig) { cfg.Bindings = []string{"order.>"} })

	r, err := relay.New(b.pg.Driver, b.pub, relay.Config{
		PollInterval: 50 * time.Millisecond, RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 50 * time.Millisecond,
		StatsInterval: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()

	const aggregates, versions = 10, 20
	w := outbox.NewWriter(b.pg.Driver)
	for v := 1; v <= versions; v++ {
		tx, err := b.pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for a := range aggregates {
			ev, err := idem.NewEvent("order.order.changed.v1", "order", fmt.Sprint(a), map[string]int{"version": v})
			if err != nil {
				t.Fatal(err)
			}
			ev.AggregateVersion = int64(v)
			if err := w.Add(ctx, tx, ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "every event applied", func() bool { return c.Stats().Applied == aggregates*versions })

	rows, err := b.pg.Pool.Query(ctx, `SELECT aggregate_id, version FROM applied ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	for rows.Next() {
		var agg string
		var v int64
		if err := rows.Scan(&agg, &v); err != nil {
			t.Fatal(err)
		}
		if v != last[agg]+1 {
			t.Errorf("aggregate %s: version %d applied after %d", agg, v, last[agg])
		}
		last[agg] = v
	}
	rows.Close()

	// A replay inside the duplicate window: JetStream acknowledges and drops
	// every copy.
	n, err := relay.Replay(ctx, b.pg.Driver, b.pub, relay.ReplayFilter{}, relay.ReplayOptions{})
	if err != nil || n != aggregates*versions {
		t.Fatalf("replay: %d %v", n, err)
	}
	// A replay around it (to the consumer's retry subject): the consumer
	// skips every copy.
	if _, err := relay.Replay(ctx, b.pg.Driver, redeliverer{b.pub, "stock"}, relay.ReplayFilter{}, relay.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "every copy skipped", func() bool { return c.Stats().Duplicates == aggregates*versions })
	if s := c.Stats(); s.Applied != aggregates*versions {
		t.Errorf("applied %d, want %d (the first replay must have been dropped by JetStream)", s.Applied, aggregates*versions)
	}
	if got := b.pg.Count(t, "applied"); got != aggregates*versions {
		t.Errorf("effects: %d, want %d", got, aggregates*versions)
	}
}
