package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/outbox"
)

// Write an order and its event in one transaction: the event exists if and
// only if the order committed.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	writer := outbox.NewWriter(postgres.NewPgx(pool))

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, status) VALUES ('42', 'confirmed')`); err != nil {
		log.Fatal(err)
	}
	ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]any{
		"orderId": "42", "customerId": "c-7",
		"lines": []map[string]string{{"productId": "p-1", "quantity": "2.000"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := writer.Add(ctx, tx, ev); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	var name, aggregate string
	if err := pool.QueryRow(ctx, `SELECT type, aggregateid FROM outbox WHERE id = $1`, ev.ID).Scan(&name, &aggregate); err != nil {
		log.Fatal(err)
	}
	fmt.Println(name, aggregate)
	// Output: order.order.placed.v1 42
}

// Events written within a traced request carry its W3C trace context: the
// relay and the consumers continue the request's trace. Here the span is
// the one an HTTP middleware such as otelhttp would put in the request's
// context; applications usually set the global propagator once instead of
// calling WithPropagator.
func ExampleWriter_WithPropagator() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	writer := outbox.NewWriter(postgres.NewPgx(pool)).WithPropagator(propagation.TraceContext{})

	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled,
	}))
	ev, err := idem.NewEvent("order.order.placed.v1", "order", "43", map[string]any{"orderId": "43"})
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return writer.Add(ctx, tx, ev) })
	if err != nil {
		log.Fatal(err)
	}

	var traceparent string
	if err := pool.QueryRow(ctx, `SELECT headers->>'traceparent' FROM outbox WHERE id = $1`, ev.ID).Scan(&traceparent); err != nil {
		log.Fatal(err)
	}
	fmt.Println(traceparent)
	// Output: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}
