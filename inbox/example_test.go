package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
)

// The stock service reserves each line of a placed order. The same event
// delivered twice (a relay republish, a broker redelivery, a replay) reserves
// stock once.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	stock, err := inbox.New(postgres.NewPgx(pool), inbox.Config{Name: "stock"})
	if err != nil {
		log.Fatal(err)
	}
	stock.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		var order struct {
			OrderID string `json:"orderId"`
			Lines   []struct {
				ProductID string `json:"productId"`
				Quantity  string `json:"quantity"`
			} `json:"lines"`
		}
		if err := json.Unmarshal(ev.Payload, &order); err != nil {
			return idem.Permanent(err) // retrying will not fix the payload
		}
		for _, line := range order.Lines {
			if _, err := tx.Exec(ctx, `INSERT INTO reservation (order_id, product_id, quantity) VALUES ($1, $2, $3)`,
				order.OrderID, line.ProductID, line.Quantity); err != nil {
				return err
			}
		}
		return nil
	})

	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]any{
		"orderId": "42", "lines": []map[string]string{{"productId": "p-1", "quantity": "2.000"}},
	})
	for range 2 {
		outcome, err := stock.Process(ctx, ev)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(outcome)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM reservation WHERE order_id = '42'`).Scan(&n)
	fmt.Println("reservations:", n)
	// Output:
	// applied
	// duplicate
	// reservations: 1
}

// A delivery whose headers carry a traceparent (the relay sends the one the
// producer's outbox.Writer wrote) is handled within a consumer span, child
// of the producer's: the handler's ctx carries it, so what the handler
// writes to its own outbox, or sends with an instrumented client, continues
// the trace. Without an OpenTelemetry SDK installed the span records
// nothing, but the trace context still passes through.
func ExampleConfig_tracing() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	shipping, err := inbox.New(postgres.NewPgx(pool), inbox.Config{
		Name: "shipping-example",
		// Usually set once for the process: otel.SetTextMapPropagator(...).
		Propagator: propagation.TraceContext{},
	})
	if err != nil {
		log.Fatal(err)
	}
	shipping.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		fmt.Println("handled in trace", trace.SpanContextFromContext(ctx).TraceID())
		return nil
	})

	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "44", map[string]any{"orderId": "44"})
	msg, _ := idem.NewMessage(ev)
	msg.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	disp, err := shipping.Deliver(ctx, inbox.Delivery{Message: msg, Source: "shipping.events", Attempt: 1, System: "rabbitmq"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(disp.Outcome)
	// Output:
	// handled in trace 4bf92f3577b34da6a3ce929d0e0e4736
	// applied
}

// Replicas of one consumer share its partitions: each runs a Group, which
// starts the subscribers of the partitions assigned to it, and hands them
// over when replicas join or leave. With one replica, it owns them all.
func ExampleGroup() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	stock, err := inbox.New(postgres.NewPgx(pool), inbox.Config{Name: "stock-group-example"})
	if err != nil {
		log.Fatal(err)
	}
	group, err := inbox.NewGroup(stock, inbox.GroupConfig{
		Partitions: 4,
		// In an application: the transport's subscriber of one partition,
		// for example amqp.NewSubscriber with SubscriberConfig.Partitions 4
		// and Partition p, delivering to stock.DeliverBatch.
		Subscriber: func(p int) (broker.Subscriber, error) { return &partitionSubscriber{p: p}, nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := group.Start(ctx); err != nil {
		log.Fatal(err)
	}
	for len(group.Owned()) < 4 { // for the example: wait for the first heartbeats
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("owned:", group.Owned())
	if err := group.Stop(ctx); err != nil { // hands the partitions over, leaves
		log.Fatal(err)
	}
	fmt.Println("owned after Stop:", group.Owned())
	// Output:
	// owned: [0 1 2 3]
	// owned after Stop: []
}

// partitionSubscriber stands for a transport's subscriber of one partition.
type partitionSubscriber struct{ p int }

func (s *partitionSubscriber) Start(context.Context) error { return nil }
func (s *partitionSubscriber) Stop(context.Context) error  { return nil }
