package outbox

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traceHeaders returns the headers that carry ctx's trace context and
// baggage, or nil when ctx carries no span: then nothing is injected, and
// nothing allocated.
func (w *Writer[TTx]) traceHeaders(ctx context.Context) propagation.MapCarrier {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	prop := w.prop
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	carrier := propagation.MapCarrier{}
	prop.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	return carrier
}

// withTrace returns headers with the trace headers added. The caller's own
// headers win: a traceparent the caller wrote keeps its tracestate too (or
// its absence), and a header the caller set under any case is not
// overwritten. headers itself is never modified.
func withTrace(headers map[string]string, trace propagation.MapCarrier) map[string]string {
	if len(trace) == 0 {
		return headers
	}
	own := func(key string) bool {
		for k := range headers {
			if strings.EqualFold(k, key) {
				return true
			}
		}
		return false
	}
	ownParent := own(traceParent)
	out := make(map[string]string, len(headers)+len(trace))
	for k, v := range trace {
		if own(k) || (ownParent && strings.EqualFold(k, traceState)) {
			continue
		}
		out[k] = v
	}
	for k, v := range headers {
		out[k] = v
	}
	return out
}

// The W3C Trace Context headers.
const (
	traceParent = "traceparent"
	traceState  = "tracestate"
)
