package binlog_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/binlog"
)

// TestSpans: the binlog relay makes a producer span per message, child of
// the span that wrote the row, and the message keeps the producer's
// traceparent.
func TestSpans(t *testing.T) {
	db := testdb.NewMariaDB(t)
	pub := memory.New()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	w3c := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	cfg := fastConfig(t)
	cfg.TracerProvider, cfg.Propagator = tp, w3c
	r := start(t, db, pub, cfg)
	eventually(t, "streaming", func() bool { return r.Stats().Streaming })

	ctx, producer := tp.Tracer("test").Start(context.Background(), "POST /orders")
	ev, err := idem.NewEvent("order.changed.v1", "order", "traced", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.NewWriter(db.Driver).WithPropagator(w3c).AddExec(ctx, db.Driver.Pool(), ev); err != nil {
		t.Fatal(err)
	}
	producer.End()
	msgs := waitLen(t, pub, 1)
	var send sdktrace.ReadOnlySpan
	eventually(t, "the send span", func() bool {
		for _, s := range exporter.GetSpans().Snapshots() {
			if s.SpanKind() == trace.SpanKindProducer {
				send = s
			}
		}
		return send != nil
	})
	if send.Parent().SpanID() != producer.SpanContext().SpanID() || send.InstrumentationScope().Name != binlog.TracerName {
		t.Errorf("send span: parent %v, scope %q; want a child of %v in %q", send.Parent(), send.InstrumentationScope().Name,
			producer.SpanContext(), binlog.TracerName)
	}
	if tp, want := msgs[0].Headers["traceparent"], producer.SpanContext().TraceID().String(); len(tp) < 36 || tp[3:35] != want {
		t.Errorf("traceparent %q, want the producer's trace %s", tp, want)
	}
}
