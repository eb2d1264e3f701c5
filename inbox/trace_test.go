package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
)

var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// tracedDelivery is a delivery of ev from Kafka whose headers carry the
// producer's span and baggage, as the relay publishes a row outbox.Writer
// wrote in that span.
func tracedDelivery(t *testing.T, ev idem.Event, producer trace.SpanContext) inbox.Delivery {
	t.Helper()
	d := delivery(t, ev)
	d.Source, d.System, d.Attempt = "outbox.event.order/1", "kafka", 2
	m, _ := baggage.NewMember("tenant", "t-1")
	b, _ := baggage.New(m)
	ctx := baggage.ContextWithBaggage(trace.ContextWithSpanContext(context.Background(), producer), b)
	d.Message.Headers = map[string]string{}
	w3c.Inject(ctx, propagation.MapCarrier(d.Message.Headers))
	return d
}

func spanAttrs(s tracetest.SpanStub) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

// TestDeliverSpans checks the consumer span of each delivery: a child of
// the producer's span, with the messaging attributes and the outcome; the
// handlers run in it (with the message's baggage), so that the events they
// write to their own outbox continue the trace; errors are recorded.
func TestDeliverSpans(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	cfg := fastPause
	cfg.Name, cfg.TracerProvider, cfg.Propagator = "stock", tp, w3c
	fail := map[string]error{
		"retried": errors.New("out of stock"),
		"parked":  idem.Permanent(errors.New("quantity is negative")),
	}
	// The handler writes an event to the consumer's own outbox, as a
	// service reacting to an event does, and records its span.
	w := outbox.NewWriter(pg.Driver).WithPropagator(w3c)
	handlerSpans := map[string]trace.SpanContext{}
	handlerBaggage := map[string]string{}
	c := effectConsumer(t, pg, cfg, func(ctx context.Context, ev idem.Event) error {
		handlerSpans[ev.AggregateID] = trace.SpanContextFromContext(ctx)
		handlerBaggage[ev.AggregateID] = baggage.FromContext(ctx).Member("tenant").Value()
		if err := fail[ev.AggregateID]; err != nil {
			return err
		}
		out, _ := idem.NewEvent("stock.reservation.made.v1", "reservation", ev.AggregateID, nil)
		return w.AddExec(ctx, pg.Driver.Pool(), out)
	})

	_, producer := tp.Tracer("test").Start(context.Background(), "POST /orders")
	producer.End()
	psc := producer.SpanContext()
	ev := func(agg string) idem.Event {
		e, _ := idem.NewEvent("order.order.placed.v1", "order", agg, nil)
		return e
	}
	applied, batchA, batchB := ev("applied"), ev("batch-a"), ev("batch-b")
	retried, parked := ev("retried"), ev("parked")

	deliver(t, c, tracedDelivery(t, applied, psc))
	deliver(t, c, tracedDelivery(t, applied, psc)) // duplicate
	deliver(t, c, tracedDelivery(t, batchA, psc), tracedDelivery(t, batchB, psc))
	deliver(t, c, tracedDelivery(t, retried, psc))
	deliver(t, c, tracedDelivery(t, parked, psc))
	untraced := ev("untraced")
	deliver(t, c, delivery(t, untraced))

	byAgg := map[string][]tracetest.SpanStub{}
	for _, s := range exporter.GetSpans() {
		if s.InstrumentationScope.Name != inbox.TracerName {
			continue
		}
		for agg, e := range map[string]idem.Event{"applied": applied, "batch-a": batchA, "batch-b": batchB, "retried": retried, "parked": parked, "untraced": untraced} {
			if spanAttrs(s)["messaging.message.id"] == e.ID.String() {
				byAgg[agg] = append(byAgg[agg], s)
			}
		}
	}
	for agg, want := range map[string][]string{
		"applied": {"applied", "duplicate"}, "batch-a": {"applied"}, "batch-b": {"applied"},
		"retried": {"retried"}, "parked": {"parked"}, "untraced": {"applied"},
	} {
		got := byAgg[agg]
		if len(got) != len(want) {
			t.Errorf("%s: %d spans, want %d", agg, len(got), len(want))
			continue
		}
		for i, s := range got {
			a := spanAttrs(s)
			if a["idem.outcome"] != want[i] {
				t.Errorf("%s: span %d outcome %q, want %q", agg, i, a["idem.outcome"], want[i])
			}
			if s.SpanKind != trace.SpanKindConsumer {
				t.Errorf("%s: kind %v, want consumer", agg, s.SpanKind)
			}
			if agg == "untraced" {
				if s.Parent.IsValid() {
					t.Errorf("span of a message without trace context has parent %s", s.Parent.SpanID())
				}
				if a["messaging.system"] != "" || a["messaging.destination.name"] != "stock.events" {
					t.Errorf("untraced: system %q destination %q, want none and stock.events", a["messaging.system"], a["messaging.destination.name"])
				}
				continue
			}
			if s.Parent.SpanID() != psc.SpanID() || s.SpanContext.TraceID() != psc.TraceID() || !s.Parent.IsRemote() {
				t.Errorf("%s: parent %s of trace %s, want the producer's span %s of %s", agg, s.Parent.SpanID(), s.SpanContext.TraceID(), psc.SpanID(), psc.TraceID())
			}
			for k, v := range map[string]string{
				"messaging.system": "kafka", "messaging.destination.name": "outbox.event.order/1",
				"messaging.operation.type": "process", "messaging.consumer.group.name": "stock",
				"idem.event.name": "order.order.placed.v1", "idem.delivery.attempt": "2",
			} {
				if a[k] != v {
					t.Errorf("%s: %s = %q, want %q", agg, k, a[k], v)
				}
			}
			if s.Name != "process outbox.event.order/1" {
				t.Errorf("%s: name %q", agg, s.Name)
			}
			failed := agg == "retried" || agg == "parked"
			if failed != (s.Status.Code == codes.Error) {
				t.Errorf("%s: status %v %q", agg, s.Status.Code, s.Status.Description)
			}
			if failed && (len(s.Events) == 0 || s.Events[0].Name != "exception") {
				t.Errorf("%s: the error is not recorded as an exception event: %v", agg, s.Events)
			}
		}
		// The handler ran in the delivery's span, with its baggage.
		if sc := handlerSpans[agg]; sc.SpanID() != got[0].SpanContext.SpanID() {
			t.Errorf("%s: the handler's context carries span %s, want the delivery's %s", agg, sc.SpanID(), got[0].SpanContext.SpanID())
		}
		if agg != "untraced" && handlerBaggage[agg] != "t-1" {
			t.Errorf("%s: the handler's baggage tenant = %q, want t-1", agg, handlerBaggage[agg])
		}
	}

	// The events the handlers wrote carry their delivery's span.
	rows, err := pg.Pool.Query(context.Background(), `SELECT aggregateid, headers->>'traceparent' FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	written, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Agg    string
		Parent *string
	}])
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != 4 {
		t.Errorf("%d events written by the handlers, want 4 (applied, batch-a, batch-b, untraced)", len(written))
	}
	for _, r := range written {
		sc := handlerSpans[r.Agg]
		want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
		if r.Parent == nil || *r.Parent != want {
			t.Errorf("event written while handling %s: traceparent %v, want the delivery span's %s", r.Agg, r.Parent, want)
		}
	}
}

// A CloudEvent whose trace context is only in its traceparent attribute
// (ce_traceparent, as another program publishes it) gets a consumer span
// that continues it, and its handler runs in that span.
func TestDeliverSpansCloudEvents(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	cfg := fastPause
	cfg.Name, cfg.TracerProvider, cfg.Propagator = "stock", tp, w3c
	var handled trace.SpanContext
	c := effectConsumer(t, pg, cfg, func(ctx context.Context, ev idem.Event) error {
		handled = trace.SpanContextFromContext(ctx)
		return nil
	})
	_, producer := tp.Tracer("test").Start(context.Background(), "POST /orders")
	producer.End()
	carrier := propagation.MapCarrier{}
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), producer.SpanContext()), carrier)
	id := idem.NewEventID()
	d := inbox.Delivery{Source: "things/0", System: "kafka", Attempt: 1, Message: idem.Message{
		Headers: map[string]string{
			"ce_specversion": "1.0", "ce_id": id.String(), "ce_source": "/third/party", "ce_type": "com.example.thing.created",
			"ce_subject": "7", "ce_traceparent": carrier["traceparent"], "content-type": "application/json",
		},
		Body: []byte(`{"n":1}`),
	}}
	if disps := deliver(t, c, d); disps[0].Outcome != inbox.Applied {
		t.Fatalf("outcome %v (%v), want applied", disps[0].Outcome, disps[0].Err)
	}
	var span *tracetest.SpanStub
	for _, s := range exporter.GetSpans() {
		if s.InstrumentationScope.Name == inbox.TracerName && spanAttrs(s)["messaging.message.id"] == id.String() {
			span = &s
		}
	}
	if span == nil {
		t.Fatal("no consumer span")
	}
	if span.Parent.TraceID() != producer.SpanContext().TraceID() || span.Parent.SpanID() != producer.SpanContext().SpanID() {
		t.Errorf("consumer span's parent %v, want the producer's span %v", span.Parent, producer.SpanContext())
	}
	if handled.SpanID() != span.SpanContext.SpanID() {
		t.Errorf("handler ran in span %v, want the consumer span %v", handled.SpanID(), span.SpanContext.SpanID())
	}
}
