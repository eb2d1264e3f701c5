package idemtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
)

// Outbox is the outbox of a database as a transaction, or the database,
// sees it: what RequireAdded, RequireNotAdded and AddedEvents read. It is
// the outbox table (idem.Tables.Outbox): events that outbox.NewLogWriter
// writes to PostgreSQL's write-ahead log instead are not in it.
type Outbox struct {
	d  driver.Dialect
	ex driver.Executor
}

// OutboxTx is the outbox as tx sees it: the events tx added, committed or
// not, and those committed before it began. Assert on it before tx commits
// or rolls back, in the transaction the code under test wrote in.
func OutboxTx[TTx any](drv driver.Driver[TTx], tx TTx) Outbox {
	return Outbox{d: drv.Dialect(), ex: drv.Tx(tx)}
}

// OutboxOf is the outbox of drv's database: the events of committed
// transactions, published or not. On a database of NewSQLite, whose pool
// has one connection, read it once the test's transactions have ended: a
// read waits for the connection they hold.
func OutboxOf[TTx any](drv driver.Driver[TTx]) Outbox {
	return Outbox{d: drv.Dialect(), ex: drv.Pool()}
}

// AddedEvents returns the events in the outbox, in the order they were
// added, or fails t.
func AddedEvents(t testing.TB, o Outbox) []idem.Event {
	t.Helper()
	evs, err := o.events()
	if err != nil {
		t.Fatalf("idemtest: read the outbox: %v", err)
	}
	return evs
}

// Added is an event RequireAdded found, with its payload decoded.
type Added[T any] struct {
	Event   idem.Event
	Payload T
}

// RequireAdded fails t unless the outbox holds an event named name whose
// payload decodes into a T (as inbox.HandleJSON decodes it: strictly, then
// T's Validate) and satisfies match; a nil match takes any. It returns the
// first such event. The failure lists the events the outbox holds, and why
// those named name did not match.
//
//	placed := idemtest.RequireAdded(t, idemtest.OutboxTx(drv, tx), "order.order.placed.v1",
//		func(p OrderPlaced) bool { return p.OrderID == "42" })
func RequireAdded[T any](t testing.TB, o Outbox, name string, match func(T) bool) Added[T] {
	t.Helper()
	evs := AddedEvents(t, o)
	var why []string
	for _, ev := range evs {
		if ev.Name != name {
			continue
		}
		p, err := inbox.DecodeJSON[T](ev)
		switch {
		case err != nil:
			why = append(why, fmt.Sprintf("%s: does not decode into %T: %s", describe(ev), p, payloadProblem(err)))
		case match != nil && !match(p):
			why = append(why, fmt.Sprintf("%s: does not match", describe(ev)))
		default:
			return Added[T]{Event: ev, Payload: p}
		}
	}
	var zero T
	t.Fatalf("idemtest: the outbox holds no event %s whose payload, as a %T, matches.\n%s%s", name, zero, reasons(why), listing(evs))
	return Added[T]{}
}

// RequireAddedPayload fails t unless the outbox holds an event named name
// whose payload, decoded into a T, equals want (reflect.DeepEqual). It
// returns the first such event. The failure shows the payloads of the
// events named name beside want.
func RequireAddedPayload[T any](t testing.TB, o Outbox, name string, want T) Added[T] {
	t.Helper()
	evs := AddedEvents(t, o)
	var why []string
	for _, ev := range evs {
		if ev.Name != name {
			continue
		}
		p, err := inbox.DecodeJSON[T](ev)
		switch {
		case err != nil:
			why = append(why, fmt.Sprintf("%s: does not decode into %T: %s", describe(ev), p, payloadProblem(err)))
		case !reflect.DeepEqual(p, want):
			why = append(why, fmt.Sprintf("%s: payload %+v", describe(ev), p))
		default:
			return Added[T]{Event: ev, Payload: p}
		}
	}
	t.Fatalf("idemtest: the outbox holds no event %s with the payload %+v.\n%s%s", name, want, reasons(why), listing(evs))
	return Added[T]{}
}

// RequireNotAdded fails t if the outbox holds an event named name, and
// lists those it holds.
func RequireNotAdded(t testing.TB, o Outbox, name string) {
	t.Helper()
	evs := AddedEvents(t, o)
	var found []string
	for _, ev := range evs {
		if ev.Name == name {
			found = append(found, describe(ev))
		}
	}
	if len(found) > 0 {
		t.Fatalf("idemtest: the outbox holds %d event(s) %s, want none:\n  %s", len(found), name, strings.Join(found, "\n  "))
	}
}

// payloadProblem says why a payload does not decode (inbox.DecodeJSON's
// error) in a few words.
func payloadProblem(err error) string {
	var pe *inbox.PayloadError
	if errors.As(err, &pe) {
		if pe.Field != "" {
			return fmt.Sprintf("field %s: %v", pe.Field, pe.Err)
		}
		return pe.Err.Error()
	}
	return err.Error()
}

// describe is one line about ev: name, aggregate, id and payload.
func describe(ev idem.Event) string {
	payload := string(ev.Payload)
	if !ev.IsJSON() {
		payload = fmt.Sprintf("(%s, %d bytes) %q", ev.ContentType, len(ev.Payload), ev.Payload)
	}
	if len(payload) > 200 {
		payload = payload[:200] + "..."
	}
	return fmt.Sprintf("%s of %s %s (id %s) %s", ev.Name, ev.AggregateType, ev.AggregateID, ev.ID, payload)
}

func reasons(why []string) string {
	if len(why) == 0 {
		return ""
	}
	return "Events of that name:\n  " + strings.Join(why, "\n  ") + "\n"
}

func listing(evs []idem.Event) string {
	if len(evs) == 0 {
		return "The outbox is empty."
	}
	lines := make([]string, len(evs))
	for i, ev := range evs {
		lines[i] = describe(ev)
	}
	return fmt.Sprintf("The outbox holds %d event(s):\n  %s", len(evs), strings.Join(lines, "\n  "))
}

// events reads the outbox, in seq order.
func (o Outbox) events() ([]idem.Event, error) {
	ctx, cancel := ctx()
	defer cancel()
	var evs []idem.Event
	err := driver.QueryRows(ctx, o.ex, outboxQuery(o.d), nil, func(rows driver.Rows) error {
		var id, typ, aggType, aggID, occurred string
		var payload, headers, contentType *string
		var bin []byte
		var version int64
		if err := rows.Scan(&id, &aggType, &aggID, &typ, &payload, &occurred, &version, &headers, &contentType, &bin); err != nil {
			return err
		}
		ev := idem.Event{Name: typ, AggregateType: aggType, AggregateID: aggID, AggregateVersion: version}
		ev.ID, _ = idem.EventID(id) // uuid.Nil when the relay would quarantine it
		if payload != nil {
			ev.Payload = json.RawMessage(*payload)
		}
		if contentType != nil {
			ev.ContentType = *contentType
		}
		if bin != nil {
			ev.Payload = json.RawMessage(bin)
		}
		if headers != nil && *headers != "" && *headers != "{}" {
			if err := json.Unmarshal([]byte(*headers), &ev.Headers); err != nil {
				return fmt.Errorf("headers of event %s: %w", id, err)
			}
		}
		at, err := time.ParseInLocation("2006-01-02 15:04:05.999999", occurred, time.UTC)
		if err != nil {
			return fmt.Errorf("occurred_at of event %s: %w", id, err)
		}
		ev.OccurredAt = at
		evs = append(evs, ev)
		return nil
	})
	return evs, err
}

// outboxQuery is the one statement idemtest runs: the outbox's rows, in seq
// order, every column as text in a form all dialects share.
func outboxQuery(d driver.Dialect) string {
	t := d.Tables().WithDefaults()
	switch d.Name() {
	case "postgres":
		return `SELECT CAST(id AS TEXT), aggregatetype, aggregateid, type, CAST(payload AS TEXT),
			to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), aggregate_version, CAST(headers AS TEXT),
			content_type, payload_binary
			FROM ` + qualified(t.Schema, t.Outbox, `"`) + ` ORDER BY seq`
	case "mysql":
		return "SELECT CAST(id AS CHAR), aggregatetype, aggregateid, type, CAST(payload AS CHAR), " +
			"DATE_FORMAT(occurred_at, '%Y-%m-%d %H:%i:%s.%f'), aggregate_version, CAST(headers AS CHAR), " +
			"content_type, payload_binary " +
			"FROM " + qualified(t.Schema, t.Outbox, "`") + " ORDER BY seq"
	}
	return `SELECT id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers,
		content_type, payload_binary
		FROM ` + qualified(t.Schema, t.Outbox, `"`) + ` ORDER BY seq`
}

// qualified quotes a table name, with its schema when there is one.
func qualified(schema, name, quote string) string {
	q := func(s string) string { return quote + strings.ReplaceAll(s, quote, quote+quote) + quote }
	if schema == "" {
		return q(name)
	}
	return q(schema) + "." + q(name)
}
