package inbox

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idem-go/idem"
)

// BenchmarkTracingOverhead measures what the consumer's tracing adds to a
// delivery of 100 messages carrying a traceparent, per message: with
// OpenTelemetry's no-op tracer and no propagator (an application that does
// not trace), with the no-op tracer and the W3C propagator (the commands
// with tracing off), and with the SDK sampling every span, dropped by a
// no-op exporter. No database: this is the CPU cost only, to compare with a
// delivery's cost in BenchmarkDeliverBatch.
//
// Run: go test -run '^$' -bench BenchmarkTracingOverhead -benchmem ./inbox/
func BenchmarkTracingOverhead(b *testing.B) {
	w3c := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
	defer func() { _ = sdk.Shutdown(context.Background()) }()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"off", Config{}},
		{"off_w3c", Config{Propagator: w3c}},
		{"sdk", Config{TracerProvider: sdk, Propagator: w3c}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := &Consumer[struct{}]{cfg: Config{Name: "bench"}, tracing: newTracing(tc.cfg)}
			const n = 100
			ds := make([]Delivery, n)
			base := make([]item, n)
			for i := range n {
				ev, _ := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]int{"i": i})
				m, _ := idem.NewMessage(ev)
				m.Headers = map[string]string{"traceparent": fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)}
				ds[i] = Delivery{Message: m, Source: "stock.events", Attempt: 1, System: "rabbitmq"}
				base[i] = item{ev: ev}
			}
			items := make([]item, n)
			disps := make([]Disposition, n)
			for i := range disps {
				disps[i] = Disposition{Action: Ack, Outcome: Applied}
			}
			errs := make([]error, n)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				copy(items, base)
				c.startSpans(ctx, ds, items)
				for i := range items {
					_ = itemContext(ctx, &items[i])
				}
				endSpans(items, disps, errs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/delivery")
		})
	}
}

type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }
