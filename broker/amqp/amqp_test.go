package amqp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
)

var fastRetry = inbox.RetryPolicy{InitialDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond, Jitter: -1}

func TestPublisherReportsUnroutable(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	exchange := testamqp.Name("idem_t_")
	p := newPublisher(t, url, exchange)
	routed := newMessage(t, "order.order.placed.v1", "1")
	lost := newMessage(t, "order.order.cancelled.v1", "1")
	if err := p.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	withChannel(t, url, func(ch *amqp091.Channel) {
		q := exchange + ".placed"
		if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "order.order.placed.v1", exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		err := p.Publish(ctx, []idem.Message{routed, lost, routed})
		var be *broker.BatchError
		if !errors.As(err, &be) {
			t.Fatalf("Publish = %v, want a *broker.BatchError", err)
		}
		if be.Errs[0] != nil || be.Errs[2] != nil {
			t.Errorf("routed messages failed: %v", be.Errs)
		}
		if !errors.Is(be.Errs[1], broker.ErrUnroutable) {
			t.Errorf("unroutable message: %v, want ErrUnroutable", be.Errs[1])
		}
		got, ok, err := ch.Get(q, true)
		if err != nil || !ok {
			t.Fatalf("get: %v %v", ok, err)
		}
		if got.MessageId != routed.EventID.String() || got.Type != routed.EventName || got.DeliveryMode != amqp091.Persistent ||
			got.ContentType != idem.ContentTypeJSON || got.RoutingKey != routed.EventName || !bytes.Equal(got.Body, routed.Body) {
			t.Errorf("published message properties: id %q type %q mode %d ct %q key %q", got.MessageId, got.Type, got.DeliveryMode, got.ContentType, got.RoutingKey)
		}
	})
}

func TestPublisherSurfacesChannelErrors(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: testamqp.Name("idem_missing_"), NoDeclare: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = p.Publish(context.Background(), []idem.Message{newMessage(t, "order.order.placed.v1", "1")})
	if err == nil || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Fatalf("Publish to a missing exchange = %v, want the broker's NOT_FOUND", err)
	}
	// The publisher recovers on a new channel.
	err = p.Publish(context.Background(), []idem.Message{newMessage(t, "order.order.placed.v1", "1")})
	if err == nil || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Fatalf("second Publish = %v, want NOT_FOUND again", err)
	}
}

func TestPublisherRedactsPassword(t *testing.T) {
	t.Parallel()
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: "amqp://user:s3cret@127.0.0.1:1/", DialTimeout: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = p.Connect(context.Background())
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "user:xxxxx@") {
		t.Fatalf("Connect = %v; want an error naming the redacted URL", err)
	}
}

func TestDeliveredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, c.DeliverBatch)
	m := newMessage(t, "order.order.placed.v1", "42")
	other := newMessage(t, "order.order.placed.v1", "43")
	// The same message published twice, as a relay does after a crash
	// between publish and mark.
	publishAll(t, b.pub, m)
	publishAll(t, b.pub, m, other)
	eventually(t, 30*time.Second, "both events applied and the copy skipped", func() bool {
		s := c.Stats()
		return s.Applied == 2 && s.Duplicates == 1
	})
	if n := b.pg.Count(t, "effect WHERE event_id = $1", m.EventID); n != 1 {
		t.Fatalf("effects of the twice-published event: %d, want 1", n)
	}
	if n := b.pg.Count(t, "processed_event WHERE consumer_name = 'stock'"); n != 2 {
		t.Fatalf("processed_event rows: %d, want 2", n)
	}
}

func TestRetryThenSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls counter
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, func(ev idem.Event) error {
		if calls.inc(ev.ID) <= 2 {
			return errors.New("stock service unavailable")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []string
	)
	b.subscribe(t, func(ctx context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
		mu.Lock()
		for _, d := range ds {
			seen = append(seen, strconv.Itoa(d.Attempt))
		}
		mu.Unlock()
		return c.DeliverBatch(ctx, ds)
	})
	m := newMessage(t, "order.order.placed.v1", "42")
	publishAll(t, b.pub, m)
	eventually(t, 30*time.Second, "the event applied", func() bool { return c.Stats().Applied == 1 })
	mu.Lock()
	got := strings.Join(seen, ",")
	mu.Unlock()
	if got != "1,2,3" {
		t.Errorf("attempts delivered: %s, want 1,2,3", got)
	}
	if n := b.pg.Count(t, "effect"); n != 1 {
		t.Errorf("effects: %d, want 1", n)
	}
	if n := b.pg.Count(t, "failed_message"); n != 0 {
		t.Errorf("failed_message rows: %d, want 0", n)
	}
	eventually(t, 10*time.Second, "the queue empty", func() bool { return queueDepth(t, b.url, b.queue) == 0 })
}

func TestRetryGoesToThisConsumerOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls counter
	stock, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, func(ev idem.Event) error {
		if calls.inc(ev.ID) == 1 {
			return errors.New("transient")
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
	b.subscribe(t, stock.DeliverBatch)
	b.subscribe(t, shipping.DeliverBatch, func(c *amqp.SubscriberConfig) { c.Queue = b.exchange + ".shipping" })
	publishAll(t, b.pub, newMessage(t, "order.order.placed.v1", "42"))
	eventually(t, 30*time.Second, "stock applied after a retry", func() bool { return stock.Stats().Applied == 1 })
	eventually(t, 30*time.Second, "shipping applied", func() bool { return shipping.Stats().Applied == 1 })
	eventually(t, 10*time.Second, "both queues empty", func() bool {
		return queueDepth(t, b.url, b.queue) == 0 && queueDepth(t, b.url, b.exchange+".shipping") == 0
	})
	if s := shipping.Stats(); s.Applied != 1 || s.Duplicates != 0 {
		t.Errorf("shipping stats %+v: want one application and no copy of stock's retry", s)
	}
}

func TestAlwaysFailingIsParkedAndQueueFlows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := newMessage(t, "order.order.placed.v1", "13")
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, func(ev idem.Event) error {
		if ev.ID == bad.EventID {
			return errors.New("no such warehouse")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, c.DeliverBatch)
	var good []idem.Message
	for i := range 20 {
		good = append(good, newMessage(t, "order.order.placed.v1", fmt.Sprint("g", i)))
	}
	// A later event of the bad one's aggregate waits behind it: parked,
	// held by it, not applied.
	later := newMessage(t, "order.order.placed.v1", "13")
	publishAll(t, b.pub, bad, later)
	publishAll(t, b.pub, good...)
	eventually(t, 30*time.Second, "good events applied, the bad one parked and the later one held", func() bool {
		s := c.Stats()
		return s.Applied == 20 && s.Parked == 2
	})
	fm, err := c.Failures().List(context.Background(), idem.FailedFilter{Consumer: "stock", Oldest: true})
	if err != nil || len(fm) != 2 {
		t.Fatalf("failed messages: %v %v", fm, err)
	}
	if fm[0].EventID != bad.EventID || fm[0].Attempts != 4 || !bytes.Equal(fm[0].Body, bad.Body) || fm[0].Source != b.queue || fm[0].HeldBy != 0 {
		t.Errorf("parked: event %s attempts %d source %q held by %d body %s", fm[0].EventID, fm[0].Attempts, fm[0].Source, fm[0].HeldBy, fm[0].Body)
	}
	if !strings.Contains(fm[0].Error, "no such warehouse") {
		t.Errorf("parked error %q", fm[0].Error)
	}
	if fm[1].EventID != later.EventID || fm[1].HeldBy != fm[0].ID {
		t.Errorf("later event of the aggregate: %s held by %d; want %s held by %d", fm[1].EventID, fm[1].HeldBy, later.EventID, fm[0].ID)
	}
	eventually(t, 10*time.Second, "queue empty", func() bool { return queueDepth(t, b.url, b.queue) == 0 })
}

func TestMalformedBodiesAreParkedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, c.DeliverBatch)
	bodies := [][]byte{[]byte("not json \xff"), []byte(`{"event_name":"order.order.placed.v1","payload":{}}`)}
	withChannel(t, b.url, func(ch *amqp091.Channel) {
		for _, body := range bodies {
			err := ch.PublishWithContext(context.Background(), b.exchange, "order.order.placed.v1", false, false,
				amqp091.Publishing{Body: body, DeliveryMode: amqp091.Persistent, Headers: amqp091.Table{"origin": "legacy"}})
			if err != nil {
				t.Fatal(err)
			}
		}
	})
	good := newMessage(t, "order.order.placed.v1", "1")
	publishAll(t, b.pub, good)
	eventually(t, 30*time.Second, "two parked and one applied", func() bool {
		s := c.Stats()
		return s.Parked == 2 && s.Applied == 1
	})
	eventually(t, 10*time.Second, "queue empty", func() bool { return queueDepth(t, b.url, b.queue) == 0 })
	fm, err := c.Failures().List(context.Background(), idem.FailedFilter{Consumer: "stock"})
	if err != nil || len(fm) != 2 {
		t.Fatalf("failed messages: %d %v", len(fm), err)
	}
	got := map[string]bool{}
	for _, m := range fm {
		got[string(m.Body)] = true
		if m.Attempts != 1 || m.Headers["origin"] != "legacy" || !strings.Contains(m.Error, "undecodable") {
			t.Errorf("parked %q: attempts %d headers %v error %q", m.Body, m.Attempts, m.Headers, m.Error)
		}
	}
	for _, body := range bodies {
		if !got[string(body)] {
			t.Errorf("raw body %q not stored", body)
		}
	}
	if s := c.Stats(); s.Parked != 2 || s.Failed != 0 {
		t.Errorf("stats after the queue drained: %+v (a requeue loop would park or fail again)", s)
	}
}

func TestQuorumQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls counter
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, func(ev idem.Event) error {
		if calls.inc(ev.ID) == 1 {
			return errors.New("transient")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, c.DeliverBatch, func(c *amqp.SubscriberConfig) { c.QueueType = amqp.Quorum })
	publishAll(t, b.pub, newMessage(t, "order.order.placed.v1", "1"), newMessage(t, "order.order.placed.v1", "2"))
	eventually(t, 30*time.Second, "both applied", func() bool { return c.Stats().Applied == 2 })
}

// TestRedeliveryAfterKillBetweenCommitAndAck kills a real consumer process
// after its transaction committed and before it acknowledged: RabbitMQ
// redelivers, and the next consumer skips the duplicate.
func TestRedeliveryAfterKillBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.declareQueue(t)
	m := newMessage(t, "order.order.placed.v1", "42")
	publishAll(t, b.pub, m)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"=1",
		"IDEM_FAULT="+amqp.FaultAfterCommitBeforeAck,
		"CHILD_PG_URL="+b.pg.URL,
		"CHILD_AMQP_URL="+b.url,
		"CHILD_EXCHANGE="+b.exchange,
		"CHILD_QUEUE="+b.queue,
		"CHILD_CONSUMER=stock",
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(stderr.String(), "fault point "+amqp.FaultAfterCommitBeforeAck) {
		t.Fatalf("child consumer: %v, want killed at the fault point; stderr:\n%s", err, stderr.String())
	}
	if n := b.pg.Count(t, "effect"); n != 1 {
		t.Fatalf("effects after the kill: %d, want 1 (committed before the crash)", n)
	}

	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, c.DeliverBatch)
	eventually(t, 30*time.Second, "the redelivery skipped as a duplicate", func() bool { return c.Stats().Duplicates == 1 })
	if n := b.pg.Count(t, "effect"); n != 1 {
		t.Fatalf("effects after the redelivery: %d, want 1", n)
	}
	eventually(t, 10*time.Second, "queue empty", func() bool { return queueDepth(t, b.url, b.queue) == 0 })
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, brokertest.Transport{
		New: func(t *testing.T, o brokertest.Options) brokertest.Instance {
			url := testamqp.URL(t)
			exchange := testamqp.Name("idem_t_")
			queue := exchange + ".events"
			pub := newPublisher(t, url, exchange)
			// The queue exists before anything is published, as in a
			// deployment where each service declares its queue.
			withChannel(t, url, func(ch *amqp091.Channel) {
				if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
					t.Fatal(err)
				}
				if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp091.Table{"x-queue-version": int32(2)}); err != nil {
					t.Fatal(err)
				}
				for _, name := range o.EventNames {
					if err := ch.QueueBind(queue, name, exchange, false, nil); err != nil {
						t.Fatal(err)
					}
				}
			})
			return brokertest.Instance{
				Publisher: pub,
				Subscribe: func(t *testing.T, deliver broker.DeliverFunc) func() {
					sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
						ConnConfig: amqp.ConnConfig{URL: url},
						Exchange:   exchange,
						Queue:      queue,
						Bindings:   o.EventNames,
						Workers:    1,
					}, broker.DeliverFunc(deliver))
					if err != nil {
						t.Fatal(err)
					}
					if err := sub.Start(context.Background()); err != nil {
						t.Fatal(err)
					}
					return func() {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						if err := sub.Stop(ctx); err != nil {
							t.Errorf("Stop: %v", err)
						}
					}
				},
			}
		},
		Features: brokertest.Features{
			Exclusive: func(t *testing.T) { testamqp.Exclusive(t) },
			Restart:   func(t *testing.T) { testamqp.Restart(t) },
		},
	})
}

func TestRetryCountersAreAtomicAcrossWorkers(t *testing.T) {
	// Many keys over several workers, each failing once: every event is
	// applied once and nothing is parked.
	t.Parallel()
	b := setup(t)
	var calls counter
	c, err := newEffectConsumer(b.pg.Driver, "stock", fastRetry, func(ev idem.Event) error {
		if calls.inc(ev.ID) == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b.subscribe(t, c.DeliverBatch, func(c *amqp.SubscriberConfig) { c.Workers = 4; c.BatchSize = 10 })
	var msgs []idem.Message
	for i := range 200 {
		msgs = append(msgs, newMessage(t, "order.order.placed.v1", fmt.Sprint(i%17)))
	}
	publishAll(t, b.pub, msgs...)
	eventually(t, 60*time.Second, "200 applied", func() bool { return c.Stats().Applied == 200 })
	if n := b.pg.Count(t, "effect"); n != 200 {
		t.Errorf("effects %d, want 200", n)
	}
	if n := b.pg.Count(t, "failed_message"); n != 0 {
		t.Errorf("parked %d, want 0", n)
	}
}

var _ = atomic.Int64{}
var _ = testdb.PostgresURLEnv
