package relay_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/telemetry/telemetrytest"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/relay"
)

// described is an in-process publisher that names its system and
// destinations, as the real transports do.
type described struct{ *memory.Publisher }

func (described) MessagingSystem() string           { return "test-broker" }
func (described) Destination(m idem.Message) string { return "events." + m.EventName }

var _ broker.Describer = described{}

var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// TestRelaySpans checks the relay's producer span per message: child of the
// span that wrote the row, with the messaging attributes; the message keeps
// the producer's traceparent, so that consumers are children of the
// producer; a row without trace context gets the relay span's; a refusal is
// recorded as an error on the span of that attempt.
func TestRelaySpans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	w := b.w.WithPropagator(w3c)

	ctx, producer := tp.Tracer("test").Start(context.Background(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	traced := event(t, "traced", 1)
	if err := w.AddExec(ctx, b.pg.Driver.Pool(), traced); err != nil {
		t.Fatal(err)
	}
	producer.End()
	untraced, refused := event(t, "untraced", 1), event(t, "refused", 1)
	b.insert(t, untraced, refused)

	refusal := errors.New("broker: message too large")
	refusedOnce := false
	b.pub.SetFunc(func(int, []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			if m.EventID == refused.ID && !refusedOnce {
				refusedOnce = true
				return refusal
			}
			return nil
		}}
	})
	cfg := fastConfig(t)
	cfg.Workers = 1 // SetFunc's closure is then called by one worker at a time
	cfg.TracerProvider, cfg.Propagator = tp, w3c
	r, err := relay.New(b.pg.Driver, described{b.pub}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.pub.WaitLen(wctx, 3); err != nil {
		t.Fatal(err)
	}

	msgs := map[string]idem.Message{}
	for _, m := range b.pub.Messages() {
		msgs[m.EventID.String()] = m
	}
	// A span ends after its Publish call returned, a moment after the
	// publisher recorded the message: wait for the four spans.
	var spans map[string][]tracetest.SpanStub
	testsvc.WaitFor(t, 10*time.Second, "the relay's four send spans", func() bool {
		spans = map[string][]tracetest.SpanStub{}
		n := 0
		for _, s := range exporter.GetSpans() {
			if s.InstrumentationScope.Name != relay.TracerName {
				continue
			}
			for _, kv := range s.Attributes {
				if kv.Key == "messaging.message.id" {
					spans[kv.Value.AsString()] = append(spans[kv.Value.AsString()], s)
					n++
				}
			}
		}
		return n >= 4
	})

	// The traced row: a child of the producer's span; the message carries
	// the producer's traceparent, unchanged.
	got := spans[traced.ID.String()]
	if len(got) != 1 {
		t.Fatalf("spans of the traced row: %d, want 1", len(got))
	}
	s := got[0]
	if s.Parent.SpanID() != producer.SpanContext().SpanID() || s.SpanContext.TraceID() != producer.SpanContext().TraceID() {
		t.Errorf("send span parent %s trace %s, want the producer's %s %s", s.Parent.SpanID(), s.SpanContext.TraceID(),
			producer.SpanContext().SpanID(), producer.SpanContext().TraceID())
	}
	if s.SpanKind != trace.SpanKindProducer || s.Name != "send events.order.order.changed.v1" {
		t.Errorf("send span %q kind %v, want \"send events.order.order.changed.v1\", producer", s.Name, s.SpanKind)
	}
	want := map[string]string{
		"messaging.system": "test-broker", "messaging.destination.name": "events.order.order.changed.v1",
		"messaging.operation.type": "send", "messaging.message.id": traced.ID.String(),
		"idem.event.name": "order.order.changed.v1", "idem.outbox.attempt": "1",
	}
	checkAttrs(t, s, want)
	if tp := msgs[traced.ID.String()].Headers["traceparent"]; tp != traceparent(producer.SpanContext()) {
		t.Errorf("published traceparent %q, want the producer's %q", tp, traceparent(producer.SpanContext()))
	}

	// The untraced row: a root span, whose context the message carries.
	got = spans[untraced.ID.String()]
	if len(got) != 1 {
		t.Fatalf("spans of the untraced row: %d, want 1", len(got))
	}
	if got[0].Parent.IsValid() {
		t.Errorf("send span of a row without trace context has parent %s", got[0].Parent.SpanID())
	}
	if tp := msgs[untraced.ID.String()].Headers["traceparent"]; tp != traceparent(got[0].SpanContext) {
		t.Errorf("published traceparent %q, want the relay span's %q", tp, traceparent(got[0].SpanContext))
	}

	// The refused row: one span with the error, then one without.
	got = spans[refused.ID.String()]
	if len(got) != 2 {
		t.Fatalf("spans of the refused row: %d, want 2 (refused, then published)", len(got))
	}
	if got[0].Status.Code != codes.Error || got[0].Status.Description != refusal.Error() || len(got[0].Events) == 0 {
		t.Errorf("span of the refused attempt: status %v %q, %d events; want the error recorded", got[0].Status.Code, got[0].Status.Description, len(got[0].Events))
	}
	if got[1].Status.Code == codes.Error {
		t.Errorf("span of the published attempt has an error: %q", got[1].Status.Description)
	}
	checkAttrs(t, got[1], map[string]string{"idem.outbox.attempt": "2"})
}

func checkAttrs(t *testing.T, s tracetest.SpanStub, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, kv := range s.Attributes {
		got[string(kv.Key)] = kv.Value.String()
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("span %q: %s = %q, want %q", s.Name, k, got[k], v)
		}
	}
}

func traceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// TestRelayCommandExportsTracesOverOTLP runs "idem relay" with
// OTEL_EXPORTER_OTLP_ENDPOINT set to a test receiver and checks that it
// exports the send span of a row written in a traced request, child of that
// request's span, under the service name idem-relay.
func TestRelayCommandExportsTracesOverOTLP(t *testing.T) {
	t.Parallel()
	bin := idemBinary(t)
	b := setup(t)
	r := telemetrytest.NewReceiver(t)

	producer := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x0a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, byte(time.Now().UnixNano())},
		SpanID:  trace.SpanID{0x0b, 1, 2, 3, 4, 5, 6, 7}, TraceFlags: trace.FlagsSampled,
	})
	ev := event(t, "otlp", 1)
	ctx := trace.ContextWithSpanContext(context.Background(), producer)
	if err := b.w.WithPropagator(w3c).AddExec(ctx, b.pg.Driver.Pool(), ev); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(bin, "relay", "--db", b.pg.URL, "--broker", "nats://embedded?dir="+t.TempDir(), "--metrics-addr", "")
	cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT="+r.URL, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SERVICE_NAME=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("idem relay: %v\n%s", err, out.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("idem relay did not stop within 30s of SIGTERM\n%s", out.String())
		}
	}()

	r.Wait(t, 60*time.Second, "send span of the traced row", func(spans []telemetrytest.Span) bool {
		for _, s := range spans {
			if s.TraceID == producer.TraceID().String() && s.ParentSpanID == producer.SpanID().String() &&
				s.Kind == "producer" && s.Service == "idem-relay" && s.Scope == relay.TracerName &&
				s.Attributes["messaging.system"] == "nats" && s.Attributes["messaging.message.id"] == ev.ID.String() {
				return true
			}
		}
		return false
	})
}
