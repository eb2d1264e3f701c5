// Package outbox writes events to the transactional outbox: in the caller's
// database transaction, so they commit or roll back with the business change
// they describe (no dual write). A relay (package relay, or Debezium reading
// the same table) publishes them later.
//
//	tx, _ := pool.Begin(ctx)
//	// ... insert the order ...
//	ev, _ := idem.NewEvent("order.order.placed.v1", "order", orderID, payload)
//	if err := writer.Add(ctx, tx, ev); err != nil { ... }
//	err = tx.Commit(ctx)
//
// When ctx carries an OpenTelemetry span (an HTTP request's server span,
// say), Add writes its W3C trace context (traceparent, tracestate) and
// baggage into each event's headers, through the global propagator
// (otel.SetTextMapPropagator) or the one given to WithPropagator. The row
// carries them, the relay publishes them as message headers, and the
// consumers' spans become children of the producer's span: one trace from
// the request to every consumer. Headers the caller wrote itself are kept.
// Package outbox uses the OpenTelemetry API only; the application chooses
// the SDK and exporter, if any.
package outbox

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// Writer adds events to the outbox within transactions of type TTx (pgx.Tx,
// *sql.Tx). It is safe for concurrent use.
type Writer[TTx any] struct {
	drv driver.Driver[TTx]
	now func() time.Time
	// prop injects trace context into the events' headers; nil: the
	// global propagator.
	prop propagation.TextMapPropagator
	// emitter and prefix, set by NewLogWriter, write events into the
	// log instead of the table.
	emitter driver.LogMessageEmitter
	prefix  string
}

// NewWriter returns a Writer using drv's dialect and tables.
func NewWriter[TTx any](drv driver.Driver[TTx]) *Writer[TTx] {
	return &Writer[TTx]{drv: drv, now: time.Now}
}

// WithPropagator returns a copy of w that injects the trace context of Add's
// ctx into the events' headers with p rather than with the global propagator
// (otel.GetTextMapPropagator, which injects nothing until the application
// sets one).
func (w *Writer[TTx]) WithPropagator(p propagation.TextMapPropagator) *Writer[TTx] {
	c := *w
	c.prop = p
	return &c
}

// WithClock returns a copy of w that gives events without an OccurredAt
// the time now returns rather than time.Now's: tests that check it set a
// clock they control (idemtest.Clock). A nil now restores time.Now.
func (w *Writer[TTx]) WithClock(now func() time.Time) *Writer[TTx] {
	c := *w
	c.now = now
	if now == nil {
		c.now = time.Now
	}
	return &c
}

// Add inserts events into the outbox in tx. They become visible to the relay
// when tx commits, and never exist if it rolls back. Every event needs an id
// (idem.NewEventID), a name, an aggregate type and id, and a JSON payload,
// or any bytes with a content type that is not JSON (idem.Event.ContentType:
// stored in the column payload_binary, the JSON column payload left NULL);
// an event with no OccurredAt gets the current time. An event whose
// NotBefore is in the future is stored with it, and relays publish it at or
// after that time (see idem.Event.NotBefore). When ctx carries a trace
// span, its trace context and baggage are added to each event's headers
// (see the package documentation); ev.Headers itself is not modified.
func (w *Writer[TTx]) Add(ctx context.Context, tx TTx, events ...idem.Event) error {
	return w.AddExec(ctx, w.drv.Tx(tx), events...)
}

// AddExec is Add on any executor. Called outside a transaction, each event is
// committed on its own: prefer Add, which ties events to the business change.
func (w *Writer[TTx]) AddExec(ctx context.Context, ex driver.Executor, events ...idem.Event) error {
	if len(events) == 0 {
		return nil
	}
	rows := make([]driver.OutboxRow, len(events))
	now := w.now().UTC()
	trace := w.traceHeaders(ctx)
	for i, ev := range events {
		if err := ev.Validate(); err != nil {
			return fmt.Errorf("idem: outbox: event %d (%s): %w", i, ev.Name, err)
		}
		at := ev.OccurredAt
		if at.IsZero() {
			at = now
		}
		var notBefore time.Time
		if ev.NotBefore.After(now) {
			notBefore = ev.NotBefore.UTC().Truncate(time.Microsecond)
			if w.emitter != nil {
				return fmt.Errorf("idem: outbox: event %d (%s): %w: a delayed event (NotBefore) needs a row to wait in; write it with NewWriter", i, ev.Name, ErrNotSupported)
			}
		}
		rows[i] = driver.OutboxRow{
			ID:               ev.ID,
			AggregateType:    ev.AggregateType,
			AggregateID:      ev.AggregateID,
			Type:             ev.Name,
			Payload:          ev.Payload,
			ContentType:      ev.ContentType,
			OccurredAt:       at.UTC().Truncate(time.Microsecond),
			AggregateVersion: ev.AggregateVersion,
			Headers:          withTrace(ev.Headers, trace),
			NotBefore:        notBefore,
		}
	}
	if w.emitter != nil {
		return w.emit(ctx, ex, rows)
	}
	if err := w.drv.Dialect().InsertOutbox(ctx, ex, rows); err != nil {
		return fmt.Errorf("idem: outbox: insert %d event(s): %w", len(rows), err)
	}
	return nil
}
