package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// BenchmarkDeliverBatch measures events/s through Consumer.DeliverBatch,
// the path every transport feeds, for a handler that inserts one row, on
// the test PostgreSQL, with tracing off and on: batches of 100 messages (one
// transaction) and single messages (one transaction each). Every message
// carries a traceparent header, as those of a traced producer do.
//
//	off: OpenTelemetry's no-op tracer with the W3C propagator (what the
//	     commands run with when tracing is not configured)
//	sdk: the SDK sampling every span, with a batching processor and an
//	     exporter that drops the spans (the cost of tracing itself)
//
// The four variants run in alternating rounds of 500 events, so that they
// share the machine's noise, and it reports the ratios sdk/off.
//
// Run: IDEM_TEST_SHELL=1 IDEM_TEST_SERVERS=postgres IDEM_TEST_CMD='go test -run XXX -bench BenchmarkDeliverBatch -benchtime 1x -count 5 ./inbox/' bash scripts/test.sh
func BenchmarkDeliverBatch(b *testing.B) {
	pg := testdb.NewPostgres(b)
	pg.Exec(b, `CREATE TABLE effect (event_id uuid PRIMARY KEY, order_id text NOT NULL)`)
	ctx := context.Background()
	insert := func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, order_id) VALUES ($1, $2)`, ev.ID, ev.AggregateID)
		return err
	}
	w3c := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
	defer func() { _ = sdk.Shutdown(context.Background()) }()
	var consumers [2]*inbox.Consumer[pgx.Tx]
	for i, cfg := range []inbox.Config{
		{Name: "bench-off", TracerProvider: noop.NewTracerProvider(), Propagator: w3c},
		{Name: "bench-sdk", TracerProvider: sdk, Propagator: w3c},
	} {
		c, err := inbox.New(pg.Driver, cfg)
		if err != nil {
			b.Fatal(err)
		}
		c.Handle("order.order.placed.v1", insert)
		consumers[i] = c
	}
	const rounds, perRound = 8, 500
	// elapsed[tracing][size]: tracing 0 off, 1 sdk; size 0 batch100, 1 single.
	var elapsed [2][2]time.Duration
	for b.Loop() {
		for range rounds {
			for v := range 4 {
				tracing, single := v%2, v/2
				ds := make([]inbox.Delivery, perRound)
				for i := range ds {
					ev, _ := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]int{"i": i})
					m, _ := idem.NewMessage(ev)
					m.Headers = map[string]string{"traceparent": fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)}
					ds[i] = inbox.Delivery{Message: m, Source: "stock.events", Attempt: 1, System: "rabbitmq"}
				}
				size := 100
				if single == 1 {
					size = 1
				}
				start := time.Now()
				for i := 0; i < len(ds); i += size {
					disps, errs := consumers[tracing].DeliverBatch(ctx, ds[i:i+size])
					for j, d := range disps {
						if errs[j] != nil || d.Outcome != inbox.Applied {
							b.Fatal(d.Outcome, d.Err, errs[j])
						}
					}
				}
				elapsed[tracing][single] += time.Since(start)
			}
		}
	}
	n := float64(b.N * rounds * perRound)
	rate := func(tracing, single int) float64 { return n / elapsed[tracing][single].Seconds() }
	b.ReportMetric(rate(0, 0), "batch100_off_events/s")
	b.ReportMetric(rate(1, 0), "batch100_sdk_events/s")
	b.ReportMetric(rate(0, 1), "single_off_events/s")
	b.ReportMetric(rate(1, 1), "single_sdk_events/s")
	b.ReportMetric(rate(1, 0)/rate(0, 0), "batch100_sdk/off")
	b.ReportMetric(rate(1, 1)/rate(0, 1), "single_sdk/off")
	b.ReportMetric(0, "ns/op")
}

// discardExporter drops every span.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }
