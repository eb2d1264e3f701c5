package amqp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testsvc"
)

var fastRetry = inbox.RetryPolicy{InitialDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond, Jitter: -1}

// failOnce fails the first attempt of each event.
func failOnce() func(idem.Event) error {
	var seen sync.Map
	return func(ev idem.Event) error {
		if _, again := seen.LoadOrStore(ev.ID, true); !again {
			return errors.New("first attempt fails")
		}
		return nil
	}
}

func TestPublisherReportsUnroutable(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	exchange := testamqp.Name("idem_t_")
	p := newPublisher(t, url, exchange)
	routed := brokertest.NewMessage(t, "order.order.placed.v1", "1", 0)
	lost := brokertest.NewMessage(t, "order.order.cancelled.v1", "1", 0)
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
	err = p.Publish(context.Background(), []idem.Message{brokertest.NewMessage(t, "order.order.placed.v1", "1", 0)})
	if err == nil || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Fatalf("Publish to a missing exchange = %v, want the broker's NOT_FOUND", err)
	}
	// The publisher recovers on a new channel.
	err = p.Publish(context.Background(), []idem.Message{brokertest.NewMessage(t, "order.order.placed.v1", "1", 0)})
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

func TestQuorumQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.consumer(t, failOnce())
	b.subscribe(t, c.DeliverBatch, func(c *amqp.SubscriberConfig) { c.QueueType = amqp.Quorum })
	brokertest.Publish(t, b.pub, brokertest.NewMessage(t, "order.order.placed.v1", "1", 0), brokertest.NewMessage(t, "order.order.placed.v1", "2", 0))
	testsvc.WaitFor(t, 30*time.Second, "both applied after a retry", func() bool { return c.Stats().Applied == 2 })
}

func TestRetryCountersAreAtomicAcrossWorkers(t *testing.T) {
	// Many keys over several workers, each failing once: every event is
	// applied once and nothing is parked.
	t.Parallel()
	b := setup(t)
	c := b.consumer(t, failOnce())
	b.subscribe(t, c.DeliverBatch, func(c *amqp.SubscriberConfig) { c.Workers = 4; c.BatchSize = 10 })
	var msgs []idem.Message
	for i := range 200 {
		msgs = append(msgs, brokertest.NewMessage(t, "order.order.placed.v1", fmt.Sprint(i%17), i))
	}
	brokertest.Publish(t, b.pub, msgs...)
	testsvc.WaitFor(t, 60*time.Second, "200 applied", func() bool { return c.Stats().Applied == 200 })
	brokertest.CheckOnceInOrder(t, b.pg, "stock", msgs)
	if n := b.pg.Count(t, "failed_message"); n != 0 {
		t.Errorf("parked %d, want 0", n)
	}
}
