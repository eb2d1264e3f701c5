package outbox_test

import (
	"context"
	"encoding/json"
	"maps"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
)

var (
	traceID = trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	spanID  = trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}
	// parent is the traceparent of the span in spanCtx.
	parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

// spanCtx returns a context carrying a sampled span (as an HTTP server
// span would) and baggage.
func spanCtx(t *testing.T) context.Context {
	t.Helper()
	ts, err := trace.ParseTraceState("vendor=x")
	if err != nil {
		t.Fatal(err)
	}
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled, TraceState: ts,
	}))
	m, _ := baggage.NewMember("tenant", "t-1")
	b, _ := baggage.New(m)
	return baggage.ContextWithBaggage(ctx, b)
}

var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// rowHeaders writes events with w in ctx and returns the headers of each
// row, by event id.
func rowHeaders(t *testing.T, ctx context.Context, pg *testdb.PG, w *outbox.Writer[pgx.Tx], events ...idem.Event) map[uuid.UUID]map[string]string {
	t.Helper()
	tx, err := pg.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(ctx, tx, events...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]map[string]string{}
	for _, ev := range events {
		var raw []byte
		if err := pg.Pool.QueryRow(context.Background(), `SELECT headers::text::bytea FROM outbox WHERE id = $1`, ev.ID).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		h := map[string]string{}
		if err := json.Unmarshal(raw, &h); err != nil {
			t.Fatal(err)
		}
		out[ev.ID] = h
	}
	return out
}

func TestAddInjectsTraceContext(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	w := outbox.NewWriter(pg.Driver).WithPropagator(w3c)

	plain, _ := idem.NewEvent("order.order.placed.v1", "order", "1", nil)
	own, _ := idem.NewEvent("order.order.placed.v1", "order", "2", nil)
	callerHeaders := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-app": "a"}
	own.Headers = callerHeaders
	mixed, _ := idem.NewEvent("order.order.placed.v1", "order", "3", nil)
	mixed.Headers = map[string]string{"Baggage": "mine=1", "x-app": "b"}

	got := rowHeaders(t, spanCtx(t), pg, w, plain, own, mixed)

	want := map[string]string{"traceparent": parent, "tracestate": "vendor=x", "baggage": "tenant=t-1"}
	if !maps.Equal(got[plain.ID], want) {
		t.Errorf("headers of an event without its own = %v, want %v", got[plain.ID], want)
	}
	// The caller's traceparent is kept, with no tracestate of another trace,
	// but baggage is added.
	want = map[string]string{"traceparent": callerHeaders["traceparent"], "x-app": "a", "baggage": "tenant=t-1"}
	if !maps.Equal(got[own.ID], want) {
		t.Errorf("headers of an event with its own traceparent = %v, want %v", got[own.ID], want)
	}
	if len(callerHeaders) != 2 {
		t.Errorf("the caller's header map was modified: %v", callerHeaders)
	}
	// A header the caller set in another case is not written twice.
	want = map[string]string{"traceparent": parent, "tracestate": "vendor=x", "Baggage": "mine=1", "x-app": "b"}
	if !maps.Equal(got[mixed.ID], want) {
		t.Errorf("headers of an event with its own Baggage = %v, want %v", got[mixed.ID], want)
	}
}

func TestAddWithoutSpanInjectsNothing(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	w := outbox.NewWriter(pg.Driver).WithPropagator(w3c)
	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "1", nil)
	// Baggage alone is not a trace.
	m, _ := baggage.NewMember("tenant", "t-1")
	b, _ := baggage.New(m)
	got := rowHeaders(t, baggage.ContextWithBaggage(context.Background(), b), pg, w, ev)
	if len(got[ev.ID]) != 0 {
		t.Errorf("headers = %v, want none: the context carries no span", got[ev.ID])
	}
}

// TestAddUsesTheGlobalPropagator is not parallel: it sets the global
// propagator, which injects nothing until an application sets one.
func TestAddUsesTheGlobalPropagator(t *testing.T) {
	pg := testdb.NewPostgres(t)
	w := outbox.NewWriter(pg.Driver)
	before, _ := idem.NewEvent("order.order.placed.v1", "order", "1", nil)
	after, _ := idem.NewEvent("order.order.placed.v1", "order", "2", nil)

	got := rowHeaders(t, spanCtx(t), pg, w, before)
	if len(got[before.ID]) != 0 {
		t.Errorf("headers with OpenTelemetry's default (no-op) propagator = %v, want none", got[before.ID])
	}

	// The package's other tests write without a span: the global
	// propagator does not concern them. OpenTelemetry's default cannot be
	// set back (its delegate follows the first propagator set), so the
	// cleanup sets an empty composite, which injects nothing as the
	// default does, for a next run of this test (-count).
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator()) })
	got = rowHeaders(t, spanCtx(t), pg, w, after)
	want := map[string]string{"traceparent": parent, "tracestate": "vendor=x"}
	if !maps.Equal(got[after.ID], want) {
		t.Errorf("headers with the global TraceContext propagator = %v, want %v", got[after.ID], want)
	}
}
