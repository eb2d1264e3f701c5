// Package sendspan makes the producer spans of the relays: one "send" span
// per published message, child of the producer's trace context that the
// message's headers carry (outbox.Writer writes it with the row), so that
// one trace runs from the request that wrote the event through the relay
// to every consumer. The polling relay and the CDC relays share it.
package sendspan

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/otelconv"
)

// The relays' own span attributes; the others are in internal/otelconv.
const (
	attrOutboxSeq = attribute.Key("idem.outbox.seq")
	attrAttempt   = attribute.Key("idem.outbox.attempt")
)

// startOptions start the spans (one slice for every span: no allocation
// per message).
var startOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}

// Tracer starts the spans of one relay.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// desc names the messaging system and destinations (nil when the
	// publisher does not say).
	desc   broker.Describer
	system string
}

// New returns the Tracer of a relay publishing through pub, with scope as
// its instrumentation scope. A nil tp or prop is the global one.
func New(scope string, tp trace.TracerProvider, prop propagation.TextMapPropagator, pub broker.Publisher) Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	t := Tracer{tracer: tp.Tracer(scope), prop: prop}
	if d, ok := pub.(broker.Describer); ok {
		t.desc, t.system = d, d.MessagingSystem()
	}
	return t
}

// Row gives what a relay knows of message j of a call: its outbox row's
// seq (0 when the message has none, a WAL message or a binlog row) and
// the attempt this call is (1 for the first).
type Row func(j int) (seq int64, attempt int)

// Start starts a producer span per message about to be published. The
// messages' headers are sent as they are, so that consumers are children
// of the producer's span too; a message without trace context gets the
// relay span's (its Headers replaced by a copy), so that its consumers
// still join a trace. It returns nil when no span has a trace (no tracer
// installed, and no context in the messages).
func (t *Tracer) Start(ctx context.Context, msgs []idem.Message, row Row) []trace.Span {
	var spans []trace.Span
	for j := range msgs {
		m := &msgs[j]
		parent := ctx
		if len(m.Headers) > 0 {
			parent = t.prop.Extract(ctx, propagation.MapCarrier(m.Headers))
		}
		// The name and attributes are set only on a span that records:
		// without an SDK, a span costs no string built.
		sctx, span := t.tracer.Start(parent, "send", startOptions...)
		if !span.SpanContext().IsValid() {
			span.End()
			continue
		}
		if spans == nil {
			spans = make([]trace.Span, len(msgs))
		}
		spans[j] = span
		if span.IsRecording() {
			attrs := []attribute.KeyValue{
				otelconv.OperationType.String("send"),
				otelconv.OperationName.String("send"),
				otelconv.MessageID.String(m.EventID.String()),
				otelconv.EventName.String(m.EventName),
			}
			if row != nil {
				seq, attempt := row(j)
				if seq != 0 {
					attrs = append(attrs, attrOutboxSeq.Int64(seq))
				}
				attrs = append(attrs, attrAttempt.Int(attempt))
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

// End ends the spans of a Publish call that returned err, recording the
// error of each message the broker did not accept.
func End(spans []trace.Span, err error) {
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
