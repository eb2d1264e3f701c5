package inbox

import (
	"context"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem/internal/otelconv"
)

// TracerName is the instrumentation scope of the consumer's spans.
const TracerName = "github.com/idem-go/idem/inbox"

// Attributes of the consumer's spans that OpenTelemetry's messaging
// semantic conventions do not name.
const (
	// AttrOutcome is what the consumer did with the delivery: applied,
	// duplicate, ignored, retried, paused, deferred or parked (Outcome
	// names, with "retried" for a failure the transport delivers again).
	AttrOutcome = attribute.Key("idem.outcome")
	// AttrEventName is the event name.
	AttrEventName = otelconv.EventName
)

// attrAttempt numbers the deliveries of the message to the consumer.
const attrAttempt = attribute.Key("idem.delivery.attempt")

// tracing is the consumer's OpenTelemetry instrumentation.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// processOptions start the consumer's spans (one slice for every span: no
// allocation per delivery).
var processOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

func newTracing(cfg Config) tracing {
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	prop := cfg.Propagator
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	return tracing{tracer: tp.Tracer(TracerName), prop: prop}
}

// startSpans starts a consumer span per delivery, child of the producer's
// context found in the decoded event's headers (the message's, plus a
// CloudEvent's traceparent and tracestate attributes), or in the message's
// when it did not decode (or of ctx's span), and records it in the items.
// The handlers of an item run in a context carrying its span
// (itemContext), so that what they write to their own outbox continues the
// trace.
func (c *Consumer[TTx]) startSpans(ctx context.Context, ds []Delivery, items []item) {
	for i := range ds {
		d := &ds[i]
		it := &items[i]
		parent := ctx
		if h := it.ev.Headers; len(h) > 0 {
			parent = c.tracing.prop.Extract(ctx, propagation.MapCarrier(h))
		} else if len(d.Message.Headers) > 0 {
			parent = c.tracing.prop.Extract(ctx, propagation.MapCarrier(d.Message.Headers))
		}
		// The name and attributes are set only on a span that records:
		// without an SDK, a span costs no string built.
		tctx, span := c.tracing.tracer.Start(parent, "process", processOptions...)
		if span.IsRecording() {
			if d.Source != "" {
				span.SetName("process " + d.Source)
			}
			id := it.ev.ID
			if id == uuid.Nil {
				id = d.Message.EventID
			}
			attrs := []attribute.KeyValue{
				otelconv.OperationType.String("process"),
				otelconv.OperationName.String("process"),
				otelconv.ConsumerGroup.String(c.cfg.Name),
				otelconv.Destination.String(d.Source),
				attrAttempt.Int(d.Attempt),
			}
			if d.System != "" {
				attrs = append(attrs, otelconv.System.String(d.System))
			}
			if id != uuid.Nil {
				attrs = append(attrs, otelconv.MessageID.String(id.String()))
			}
			if name := it.ev.Name; name != "" {
				attrs = append(attrs, AttrEventName.String(name))
			}
			span.SetAttributes(attrs...)
		}
		if span.SpanContext().IsValid() {
			it.span = span
			it.baggage = baggage.FromContext(tctx)
		} else {
			span.End()
		}
	}
}

// endSpans ends the items' spans with the outcome of their deliveries.
func endSpans(items []item, disps []Disposition, errs []error) {
	for i := range items {
		span := items[i].span
		if span == nil {
			continue
		}
		d, err := disps[i], errs[i]
		if span.IsRecording() {
			span.SetAttributes(AttrOutcome.String(outcomeName(d, err)))
			if err == nil {
				err = d.Err
			}
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
		}
		span.End()
	}
}

// outcomeName names what the consumer did with a delivery.
func outcomeName(d Disposition, err error) string {
	switch {
	case err != nil:
		return "retried"
	case d.Outcome == Failed:
		return "retried"
	}
	return d.Outcome.String()
}

// itemContext returns ctx carrying it's span and baggage, for its handlers:
// ctx itself when it has no span.
func itemContext(ctx context.Context, it *item) context.Context {
	if it.span == nil {
		return ctx
	}
	if it.baggage.Len() > 0 {
		ctx = baggage.ContextWithBaggage(ctx, it.baggage)
	}
	return trace.ContextWithSpan(ctx, it.span)
}
