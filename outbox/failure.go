package outbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// FailureEventsConfig adjusts FailureEvents.
type FailureEventsConfig struct {
	// Body puts the message's body and headers in the events. Off by
	// default: a failure notice says what failed and why, not what the
	// message held, which subscribers to failures need not see.
	Body bool
}

// FailedMessageAggregate is the aggregate type of the failure events: a
// parked message's events are those of its failure store entry (aggregate
// id: the entry's id), so that each entry's notices keep their order.
const FailedMessageAggregate = "idem.failed_message"

// QuarantinedRowAggregate is the aggregate type of the notices of
// quarantined outbox rows (idem.FailureRowQuarantined): the aggregate id is
// the row's table and seq ("outbox:1042").
const QuarantinedRowAggregate = "idem.outbox_row"

// FailureEvents returns a hook for inbox.Config.OnFailure,
// inbox.FailureStore.WithFailureHook and relay.Config.OnQuarantine that
// writes each notice into the outbox of w as an event named after it
// (idem.FailureMessageParked, idem.FailureMessageResolved or
// idem.FailureRowQuarantined), in the transaction of the park,
// resolution or quarantine it tells of: the notice exists if and only if that change
// committed, and the relay publishes it to whoever subscribes to
// "idem.failure.#". Its payload is the notice as JSON, without the
// message's body and headers unless cfg.Body.
//
// The outbox must be in the database of the failure store: the consumer's
// service's own outbox, as each service of the shop has; for a relay, the
// outbox it relays, which then publishes the notice itself.
func FailureEvents[TTx any](w *Writer[TTx], cfg FailureEventsConfig) func(context.Context, driver.Executor, idem.FailureNotice) error {
	return func(ctx context.Context, ex driver.Executor, n idem.FailureNotice) error {
		ev, err := FailureEvent(n, cfg)
		if err != nil {
			return err
		}
		return w.AddExec(ctx, ex, ev)
	}
}

// FailureEvent returns the event FailureEvents writes for n. Its texts
// are valid UTF-8 without NUL, which every outbox's JSON column takes:
// other bytes become U+FFFD (the failure store keeps them as they were).
func FailureEvent(n idem.FailureNotice, cfg FailureEventsConfig) (idem.Event, error) {
	if !idem.IsFailureNotice(n.Name) {
		return idem.Event{}, fmt.Errorf("idem: outbox: failure notice named %q: want one of the idem.Failure... names", n.Name)
	}
	if !cfg.Body {
		n.Body, n.Headers = nil, nil
	}
	for _, p := range []*string{&n.Consumer, &n.Source, &n.Class, &n.Group, &n.EventName, &n.AggregateType,
		&n.AggregateID, &n.Error, &n.Resolution, &n.RedirectedTo, &n.By} {
		*p = jsonText(*p)
	}
	if n.Headers != nil {
		h := make(map[string]string, len(n.Headers))
		for k, v := range n.Headers {
			h[jsonText(k)] = jsonText(v)
		}
		n.Headers = h
	}
	aggType, aggID := FailedMessageAggregate, strconv.FormatInt(n.FailedMessageID, 10)
	if n.OutboxSeq != 0 {
		n.OutboxTable = jsonText(n.OutboxTable)
		aggType, aggID = QuarantinedRowAggregate, n.OutboxTable+":"+strconv.FormatInt(n.OutboxSeq, 10)
	}
	ev, err := idem.NewEvent(n.Name, aggType, aggID, n)
	if err != nil {
		return idem.Event{}, fmt.Errorf("idem: outbox: failure notice: %w", err)
	}
	if !n.At.IsZero() {
		ev.OccurredAt = n.At
	}
	return ev, nil
}

// jsonText returns s as valid UTF-8 without NUL (PostgreSQL's jsonb
// refuses \u0000), other bytes replaced by U+FFFD.
func jsonText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
