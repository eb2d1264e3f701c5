package cdc_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/cdc"
)

// TestSpans: the CDC relay makes a producer span per message, child of the
// span that wrote the row or the WAL message; the message keeps the
// producer's traceparent; a row without trace context gets the relay
// span's, so that its consumers still join a trace.
func TestSpans(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	w3c := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	cfg := fastConfig(t)
	cfg.TracerProvider, cfg.Propagator = tp, w3c
	start(t, pg, pub, cfg)

	ctx, producer := tp.Tracer("test").Start(context.Background(), "POST /orders")
	row, wal, bare := event(t, "row", 1), event(t, "wal", 1), event(t, "bare", 1)
	if err := outbox.NewWriter(pg.Driver).WithPropagator(w3c).AddExec(ctx, pg.Driver.Pool(), row); err != nil {
		t.Fatal(err)
	}
	lw, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if err := lw.WithPropagator(w3c).AddExec(ctx, pg.Driver.Pool(), wal); err != nil {
		t.Fatal(err)
	}
	producer.End()
	if err := outbox.NewWriter(pg.Driver).AddExec(context.Background(), pg.Driver.Pool(), bare); err != nil {
		t.Fatal(err)
	}
	msgs := waitLen(t, pub, 3, 20*time.Second)

	sends := map[string]sdktrace.ReadOnlySpan{}
	eventually(t, 10*time.Second, "three send spans", func() bool {
		for _, s := range exporter.GetSpans().Snapshots() {
			if s.SpanKind() == trace.SpanKindProducer {
				for _, a := range s.Attributes() {
					if a.Key == "messaging.message.id" {
						sends[a.Value.AsString()] = s
					}
				}
			}
		}
		return len(sends) == 3
	})
	for _, ev := range []idem.Event{row, wal} {
		s := sends[ev.ID.String()]
		if s.Parent().SpanID() != producer.SpanContext().SpanID() || s.SpanContext().TraceID() != producer.SpanContext().TraceID() {
			t.Errorf("the span of %s is not a child of the producer's: parent %v", ev.AggregateID, s.Parent())
		}
		if s.InstrumentationScope().Name != cdc.TracerName {
			t.Errorf("scope %q", s.InstrumentationScope().Name)
		}
	}
	for _, m := range msgs {
		tp := m.Headers["traceparent"]
		switch m.EventID {
		case row.ID, wal.ID:
			if want := producer.SpanContext().TraceID().String(); len(tp) < 36 || tp[3:35] != want {
				t.Errorf("message %s: traceparent %q, want the producer's trace %s", m.EventID, tp, want)
			}
		case bare.ID:
			s := sends[bare.ID.String()]
			if s.Parent().IsValid() || len(tp) < 36 || tp[3:35] != s.SpanContext().TraceID().String() {
				t.Errorf("the row without trace context: traceparent %q, want the relay span's trace %s", tp, s.SpanContext().TraceID())
			}
		}
	}
}
