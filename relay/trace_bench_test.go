package relay

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/relay/internal/sendspan"
)

// BenchmarkTracingOverhead measures what the relay's tracing adds to the
// publication of a round of 100 messages whose rows carry a traceparent,
// per message: with OpenTelemetry's no-op tracer and no propagator (an
// application that does not trace), with the no-op tracer and the W3C
// propagator (the commands with tracing off), and with the SDK sampling
// every span, dropped by a no-op exporter. No database or broker: this is
// the CPU cost only, to compare with a message's cost in bench relay
// (internal/tools/bench).
//
// Run: go test -run '^$' -bench BenchmarkTracingOverhead -benchmem ./relay/
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
			t := newTracing(tc.cfg, memory.New())
			const n = 100
			base := make([]idem.Message, n)
			for i := range n {
				ev, _ := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]int{"i": i})
				ev.Headers = map[string]string{"traceparent": fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)}
				base[i], _ = idem.NewMessage(ev)
			}
			msgs := make([]idem.Message, n)
			b.ReportAllocs()
			for b.Loop() {
				copy(msgs, base)
				sendspan.End(t.Start(context.Background(), msgs, func(j int) (int64, int) { return int64(j + 1), 1 }), nil)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/message")
		})
	}
}

type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }
