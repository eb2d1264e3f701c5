// Package telemetry sets up OpenTelemetry tracing for the commands (idem
// relay, shop) from the standard OTEL_* environment variables. The library
// packages (outbox, relay, inbox) use the OpenTelemetry API only; this is
// where the commands choose the SDK and the exporter.
//
// Tracing is off unless configured: OTEL_TRACES_EXPORTER=otlp (or console),
// or an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) with OTEL_TRACES_EXPORTER unset. The
// propagator is always W3C Trace Context and Baggage, so that trace context
// passes through a command even when it exports nothing.
package telemetry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Help describes the variables Setup reads, for the commands' --help.
const Help = `Tracing (OpenTelemetry, off unless configured; W3C traceparent and baggage
are always propagated):
  OTEL_TRACES_EXPORTER        otlp, console (spans on stderr) or none; unset: otlp
                              when an OTLP endpoint is set, else none
  OTEL_EXPORTER_OTLP_ENDPOINT collector base URL, e.g. http://localhost:4318
                              (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: the full URL)
  OTEL_EXPORTER_OTLP_PROTOCOL http/protobuf (default) or grpc (port 4317)
  OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _INSECURE, _CERTIFICATE, _COMPRESSION
  OTEL_SERVICE_NAME           service name (default %s)
  OTEL_RESOURCE_ATTRIBUTES    e.g. deployment.environment=prod,service.version=1.2
  OTEL_TRACES_SAMPLER         parentbased_always_on (default), parentbased_traceidratio,
                              always_off...; OTEL_TRACES_SAMPLER_ARG: its ratio
  OTEL_SDK_DISABLED=true      turns tracing off`

// Tracing is the tracing set up for a command.
type Tracing struct {
	// Exporter describes where spans go ("otlp http/protobuf",
	// "console"), "" when tracing is off.
	Exporter string
	provider *sdktrace.TracerProvider
}

// Enabled reports whether spans are exported.
func (t *Tracing) Enabled() bool { return t.provider != nil }

// Shutdown exports the spans still buffered and stops the exporter; it is
// a no-op when tracing is off. Call it before the command exits.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Setup sets the global propagator to W3C Trace Context and Baggage and,
// when the environment asks for it, installs an SDK tracer provider with a
// batching exporter as the global one. service is the default service name
// (OTEL_SERVICE_NAME overrides it). Errors of the exporter (a collector
// away) are logged to log at warn level; they never stop the command.
func Setup(ctx context.Context, service string, log *slog.Logger) (*Tracing, error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return &Tracing{}, nil
	}
	exporter, desc, err := newExporter(ctx)
	if err != nil || exporter == nil {
		return &Tracing{}, err
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
	)
	if err != nil && res == nil {
		return &Tracing{}, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	// The sampler (OTEL_TRACES_SAMPLER) and the batching (OTEL_BSP_*) come
	// from the environment, read by the SDK.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	if log != nil {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			log.Warn("tracing: export failed; spans are dropped, the command goes on", "error", err)
		}))
	}
	return &Tracing{Exporter: desc, provider: tp}, nil
}

// newExporter returns the exporter the environment names, or nil when
// tracing is off.
func newExporter(ctx context.Context) (sdktrace.SpanExporter, string, error) {
	name := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")))
	if name == "" {
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, "", nil
		}
		name = "otlp"
	}
	switch name {
	case "none":
		return nil, "", nil
	case "console":
		exp, err := stdouttrace.New(stdouttrace.WithWriter(os.Stderr))
		return exp, "console", err
	case "otlp":
	default:
		return nil, "", fmt.Errorf("OTEL_TRACES_EXPORTER=%q: want otlp, console or none", name)
	}
	protocol := strings.ToLower(strings.TrimSpace(cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")))
	// The exporters read the rest of their configuration (endpoint,
	// headers, timeout, TLS, compression) from the environment.
	switch protocol {
	case "http/protobuf":
		exp, err := otlptracehttp.New(ctx)
		return exp, "otlp http/protobuf", err
	case "grpc":
		exp, err := otlptracegrpc.New(ctx)
		return exp, "otlp grpc", err
	}
	return nil, "", fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: want http/protobuf or grpc", protocol)
}

// ShutdownTimeout bounds the flush of the spans at exit.
const ShutdownTimeout = 5 * time.Second

// Close flushes t within ShutdownTimeout, logging a failure.
func (t *Tracing) Close(log *slog.Logger) {
	if t == nil || t.provider == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) && log != nil {
		log.Warn("tracing: spans not exported at exit", "error", err)
	}
}
