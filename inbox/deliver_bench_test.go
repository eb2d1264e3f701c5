package inbox_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// BenchmarkDeliverBatch measures events/s through Consumer.DeliverBatch,
// the path every transport feeds, for a handler that inserts one row:
// batches of 100 messages (one transaction) and single messages (one
// transaction each), in alternating rounds, on the test PostgreSQL. Every
// message carries a traceparent header, as those of a traced producer do.
//
// With IDEM_BENCH_TRACING=sdk the process installs the OpenTelemetry SDK
// as the global tracer provider, sampling every span, with a batching
// processor and an exporter that drops the spans: the cost of tracing
// itself. Unset, the global provider is OpenTelemetry's no-op one, as in
// an application that does not trace.
//
// Run: IDEM_TEST_SHELL=1 IDEM_TEST_SERVERS=postgres IDEM_TEST_CMD='go test -run XXX -bench BenchmarkDeliverBatch -benchtime 1x -count 5 ./inbox/' bash scripts/test.sh
func BenchmarkDeliverBatch(b *testing.B) {
	if os.Getenv("IDEM_BENCH_TRACING") == "sdk" {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
		prev := otel.GetTracerProvider()
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
		defer func() {
			otel.SetTracerProvider(prev)
			_ = tp.Shutdown(context.Background())
		}()
	}
	pg := testdb.NewPostgres(b)
	pg.Exec(b, `CREATE TABLE effect (event_id uuid PRIMARY KEY, order_id text NOT NULL)`)
	ctx := context.Background()
	c, err := inbox.New(pg.Driver, inbox.Config{Name: "bench-deliver"})
	if err != nil {
		b.Fatal(err)
	}
	c.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, order_id) VALUES ($1, $2)`, ev.ID, ev.AggregateID)
		return err
	})
	const rounds, perRound = 8, 500
	var elapsed [2]time.Duration
	for b.Loop() {
		for range rounds {
			for v := range 2 {
				ds := make([]inbox.Delivery, perRound)
				for i := range ds {
					ev, _ := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]int{"i": i})
					m, _ := idem.NewMessage(ev)
					m.Headers = map[string]string{"traceparent": fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)}
					ds[i] = inbox.Delivery{Message: m, Source: "stock.events", Attempt: 1, System: "rabbitmq"}
				}
				size := 100
				if v == 1 {
					size = 1
				}
				start := time.Now()
				for i := 0; i < len(ds); i += size {
					disps, errs := c.DeliverBatch(ctx, ds[i:i+size])
					for j, d := range disps {
						if errs[j] != nil || d.Outcome != inbox.Applied {
							b.Fatal(d.Outcome, d.Err, errs[j])
						}
					}
				}
				elapsed[v] += time.Since(start)
			}
		}
	}
	n := float64(b.N * rounds * perRound)
	b.ReportMetric(n/elapsed[0].Seconds(), "batch100_events/s")
	b.ReportMetric(n/elapsed[1].Seconds(), "single_events/s")
	b.ReportMetric(0, "ns/op")
}

// discardExporter drops every span.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }
