package telemetry_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/telemetry"
	"github.com/idem-go/idem/internal/telemetry/telemetrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The tests set environment variables and the global tracer provider: none
// runs in parallel.

var otelVars = []string{
	"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
	"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
}

// cleanEnv unsets the OTEL_* variables for the test; os.Getenv then returns
// "" for each, which Setup reads as unset.
func cleanEnv(t *testing.T) {
	for _, v := range otelVars {
		t.Setenv(v, "")
	}
}

func TestOffUnlessConfiguredButPropagates(t *testing.T) {
	cleanEnv(t)
	tr, err := telemetry.Setup(context.Background(), "idem-test", slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if tr.Enabled() || tr.Exporter != "" {
		t.Errorf("tracing on (%q) with no OTEL_* variable set", tr.Exporter)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown of tracing off: %v", err)
	}
	fields := otel.GetTextMapPropagator().Fields()
	for _, want := range []string{"traceparent", "tracestate", "baggage"} {
		if !slices.Contains(fields, want) {
			t.Errorf("global propagator fields %v lack %s", fields, want)
		}
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	if tr, err := telemetry.Setup(context.Background(), "idem-test", nil); err != nil || tr.Enabled() {
		t.Errorf("OTEL_TRACES_EXPORTER=none: enabled %v, %v", tr.Enabled(), err)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if tr, err := telemetry.Setup(context.Background(), "idem-test", nil); err != nil || tr.Enabled() {
		t.Errorf("OTEL_SDK_DISABLED=true: enabled %v, %v", tr.Enabled(), err)
	}
}

func TestExportsOverOTLPHTTP(t *testing.T) {
	cleanEnv(t)
	r := telemetrytest.NewReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.URL)
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
	tr, err := telemetry.Setup(context.Background(), "idem-test", slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Enabled() || tr.Exporter != "otlp http/protobuf" {
		t.Fatalf("enabled %v exporter %q, want otlp http/protobuf", tr.Enabled(), tr.Exporter)
	}
	_, span := otel.Tracer("test").Start(context.Background(), "work")
	span.End()
	// Shutdown flushes what the batching processor holds.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	spans := r.Trace(span.SpanContext().TraceID().String())
	if len(spans) != 1 || spans[0].Name != "work" || spans[0].Service != "idem-test" {
		t.Fatalf("received %+v, want the span \"work\" of service idem-test", spans)
	}

	// OTEL_SERVICE_NAME overrides the command's name.
	t.Setenv("OTEL_SERVICE_NAME", "relay-eu-1")
	tr, err = telemetry.Setup(context.Background(), "idem-test", slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	_, span = otel.Tracer("test").Start(context.Background(), "more work")
	span.End()
	tr.Close(slog.Default())
	spans = r.Trace(span.SpanContext().TraceID().String())
	if len(spans) != 1 || spans[0].Service != "relay-eu-1" {
		t.Fatalf("received %+v, want service relay-eu-1", spans)
	}
}

func TestConfigurationErrorsSayWhatToSet(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"OTEL_TRACES_EXPORTER", "zipkin", "want otlp, console or none"},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "want http/protobuf or grpc"},
	} {
		cleanEnv(t)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		t.Setenv(tc.name, tc.value)
		_, err := telemetry.Setup(context.Background(), "idem-test", nil)
		if err == nil || !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%s: err = %v, want one naming the variable and %q", tc.name, tc.value, err, tc.want)
		}
	}
}
