package shipping

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/internal/shoptest"
)

// subscribeTo connects the preparation consumer to a transport and returns
// the publisher of that transport.
func subscribeTo(t *testing.T, transport string, c *inbox.Consumer[*sql.Tx]) broker.Publisher {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var (
		pub interface {
			broker.Publisher
			Close() error
		}
		sub broker.Subscriber
		err error
	)
	switch transport {
	case "amqp":
		url, exchange := shoptest.RabbitMQ(t, "idem_shipping_")
		pub, err = amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url, Logger: quiet}, Exchange: exchange})
		if err == nil {
			sub, err = amqp.NewSubscriber(amqp.SubscriberConfig{ConnConfig: amqp.ConnConfig{URL: url, Logger: quiet},
				Exchange: exchange, Queue: exchange + ".shipping", Bindings: []string{"order.#"}}, c.DeliverBatch)
		}
	case "nats":
		srv, serr := embedded.Start(context.Background(), embedded.Config{Dir: t.TempDir()})
		if serr != nil {
			t.Fatal(serr)
		}
		t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
		conn := func() nats.ConnConfig {
			nc, err := srv.Connect()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			return nats.ConnConfig{Conn: nc, Logger: quiet}
		}
		pub, err = nats.NewPublisher(context.Background(), nats.PublisherConfig{ConnConfig: conn()})
		if err == nil {
			sub, err = nats.NewSubscriber(nats.SubscriberConfig{ConnConfig: conn(), Consumer: "shipping"}, c.DeliverBatch)
		}
	case "kafka":
		cl, kerr := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "outbox.event.order"))
		if kerr != nil {
			t.Fatal(kerr)
		}
		t.Cleanup(cl.Close)
		cc := kafka.ClientConfig{Brokers: cl.ListenAddrs(), Logger: quiet}
		pub, err = kafka.NewPublisher(kafka.PublisherConfig{ClientConfig: cc})
		if err == nil {
			sub, err = kafka.NewSubscriber(kafka.SubscriberConfig{ClientConfig: cc, Group: "shipping", Topics: []string{"outbox.event.order"}}, c.DeliverBatch)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	shoptest.Start(t, sub)
	return pub
}

// TestOrderKeptThroughRetries places an order and cancels it while the
// first delivery of "order placed" fails, on every transport: shipping
// applies "placed" (its retry) before "cancelled", so the preparation is
// created, then cancelled; never a preparation made after the cancellation,
// nor a cancellation lost before it. Then an impossible order published
// straight to the broker is parked, not applied.
func TestOrderKeptThroughRetries(t *testing.T) {
	for _, transport := range []string{"amqp", "nats", "kafka"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			s, db, _ := setup(t)
			id := shoptest.OrderID()
			placed, cancelled := events(t, id)
			var failures atomic.Int32
			// After shipping's own handler, in the same transaction: the
			// first two tries of "placed" fail and roll everything back (a
			// batch that fails is tried again one event at a time: two
			// failures make sure that one of them is a failed attempt).
			s.preparation.Handle(inbox.AnyEvent, func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
				if ev.ID == placed.ID && failures.Add(1) <= 2 {
					return errors.New("warehouse system busy")
				}
				return nil
			})
			pub := subscribeTo(t, transport, s.preparation)
			var msgs []idem.Message
			for _, ev := range []idem.Event{placed, cancelled} {
				m, err := idem.NewMessage(ev)
				if err != nil {
					t.Fatal(err)
				}
				msgs = append(msgs, m)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := pub.Publish(ctx, msgs); err != nil {
				t.Fatal(err)
			}
			shoptest.WaitFor(t, 30*time.Second, "the cancellation applied", func() bool {
				return len(shoptest.Outbox(t, db, shop.PreparationCancelled)) == 1
			})
			if failures.Load() < 3 {
				t.Fatalf("placed tried %d times, want its first tries to fail and a retry", failures.Load())
			}
			created := shoptest.Outbox(t, db, shop.PreparationCreated)
			if len(created) != 1 {
				t.Fatalf("%d preparation.created events, want 1: placed was applied after the cancellation", len(created))
			}
			var createdSeq, cancelledSeq int64
			q := db.Q(`SELECT seq FROM outbox WHERE type = $1`)
			if err := db.SQL.QueryRow(q, shop.PreparationCreated).Scan(&createdSeq); err != nil {
				t.Fatal(err)
			}
			if err := db.SQL.QueryRow(q, shop.PreparationCancelled).Scan(&cancelledSeq); err != nil {
				t.Fatal(err)
			}
			if createdSeq > cancelledSeq {
				t.Errorf("preparation cancelled (seq %d) before it was created (seq %d)", cancelledSeq, createdSeq)
			}
			if n := shoptest.Count(t, db, `SELECT count(*) FROM preparation WHERE order_id = $1 AND status = 'active'`, id); n != 0 {
				t.Errorf("the cancelled order has %d active preparation(s)", n)
			}

			// An impossible order published straight to the broker (a
			// quantity of -7) is parked, not applied.
			bad := shoptest.OrderID()
			badEv := shoptest.Event(t, shop.OrderPlaced, bad, 1,
				`{"orderId":"`+bad+`","customerId":"c-1","lines":[{"productId":"p-1","quantity":"-7"}]}`)
			m, err := idem.NewMessage(badEv)
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Publish(ctx, []idem.Message{m}); err != nil {
				t.Fatal(err)
			}
			shoptest.WaitFor(t, 30*time.Second, "the impossible order parked", func() bool {
				return shoptest.Parked(t, db, PreparationConsumer) == 1
			})
			if n := shoptest.Count(t, db, `SELECT count(*) FROM preparation WHERE order_id = $1`, bad); n != 0 {
				t.Errorf("%d preparation(s) of an order of -7", n)
			}
		})
	}
}
