package relay

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/otelconv"
)

// TracerName is the instrumentation scope of the relay's spans.
const TracerName = "github.com/idem-go/idem/relay"

// The relay's own span attributes; the others are in internal/otelconv.
const (
	attrOutboxSeq = attribute.Key("idem.outbox.seq")
	attrAttempt   = attribute.Key("idem.outbox.attempt")
)

// tracing is the relay's OpenTelemetry instrumentation.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// desc names the messaging system and destinations (nil when the
	// publisher does not say).
	desc   broker.Describer
	system string
}

// sendOptions start the relay's spans (one slice for every span: no
// allocation per message).
var sendOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}

func newTracing(cfg Config, pub broker.Publisher) tracing {
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	prop := cfg.Propagator
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	t := tracing{tracer: tp.Tracer(TracerName), prop: prop}
	if d, ok := pub.(broker.Describer); ok {
		t.desc, t.system = d, d.MessagingSystem()
	}
	return t
}

// startSpans starts a producer span per message about to be published,
// child of the producer's context carried in the message's headers (the
// trace context outbox.Writer wrote with the row). Those headers are sent
// as they are, so that consumers are children of the producer's span too.
// A message without trace context gets the relay span's, so that its
// consumers still join a trace. It returns nil when no span has a trace
// (no tracer installed, and no context in the messages).
func (t *tracing) startSpans(ctx context.Context, rows []*driver.ClaimedRow, msgs []idem.Message) []trace.Span {
	var spans []trace.Span
	for j := range msgs {
		m := &msgs[j]
		parent := ctx
		if len(m.Headers) > 0 {
			parent = t.prop.Extract(ctx, propagation.MapCarrier(m.Headers))
		}
		// The name and attributes are set only on a span that records:
		// without an SDK, a span costs no string built.
		sctx, span := t.tracer.Start(parent, "send", sendOptions...)
		if !span.SpanContext().IsValid() {
			span.End()
			continue
		}
		if spans == nil {
			spans = make([]trace.Span, len(msgs))
		}
		spans[j] = span
		if span.IsRecording() {
			row := rows[j]
			attrs := []attribute.KeyValue{
				otelconv.OperationType.String("send"),
				otelconv.OperationName.String("send"),
				otelconv.MessageID.String(m.EventID.String()),
				otelconv.EventName.String(m.EventName),
				attrOutboxSeq.Int64(row.Seq),
				attrAttempt.Int(row.Attempts + 1),
			}
			if t.system != "" {
				attrs = append(attrs, otelconv.System.String(t.system))
			}
			if t.desc != nil {
				if dest := t.desc.Destination(*m); dest != "" {
					attrs = append(attrs, otelconv.Destination.String(dest))
					span.SetName("send " + dest)
				}
			}
			span.SetAttributes(attrs...)
		}
		if !trace.SpanContextFromContext(parent).IsValid() {
			// No producer context: the consumers follow the relay's span.
			headers := make(map[string]string, len(m.Headers)+2)
			for k, v := range m.Headers {
				headers[k] = v
			}
			t.prop.Inject(sctx, propagation.MapCarrier(headers))
			m.Headers = headers
		}
	}
	return spans
}

// endSpans ends the spans of a Publish call that returned err.
func endSpans(spans []trace.Span, err error) {
	if spans == nil {
		return
	}
	results := broker.Results(err, len(spans))
	for j, span := range spans {
		if span == nil {
			continue
		}
		if res := results[j]; res != nil && span.IsRecording() {
			span.RecordError(res)
			span.SetStatus(codes.Error, res.Error())
		}
		span.End()
	}
}
