// Package shoptest holds what the shop services' tests share: a fresh
// database per test, the test servers, events with any payload, delivery
// through a consumer as a transport does it, and the rows a test checks. It
// is the one place where the shop's tests reach idem's internal test
// helpers.
package shoptest

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/carrier"
	"github.com/idem-go/idem/shop/store"
)

// Open returns a fresh SQLite database for service in a temporary
// directory, with idem's migrations and own applied. It is closed at the
// end of the test.
func Open(t testing.TB, service string, own store.Migrations) *store.DB {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, service, "sqlite:"+filepath.Join(t.TempDir(), "db"), "test_"+service, store.Options{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := db.Migrate(ctx, own, nil); err != nil {
		t.Fatal(err)
	}
	return db
}

// PostgresURL returns the URL of the test PostgreSQL server (make test
// starts it), or fails the test. The server stays up until the test ends.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return testdb.PostgresURL(t)
}

// MariaDBURL returns the URL of the test MariaDB server, or fails the test.
func MariaDBURL(t testing.TB) string {
	t.Helper()
	return testdb.MariaDBURL(t)
}

// RabbitMQ returns the URL of the test RabbitMQ server, or fails the test,
// and a name starting with prefix that no other test uses, for the
// exchanges and queues the test declares.
func RabbitMQ(t testing.TB, prefix string) (url, name string) {
	t.Helper()
	return testamqp.URL(t), testamqp.Name(prefix)
}

// Start starts sub, or fails the test, and stops it when the test ends.
func Start(t testing.TB, sub broker.Subscriber) {
	t.Helper()
	testsvc.Start(t, sub)
}

// WaitFor polls cond until it is true, and fails the test if it is still
// false after d; what says what was awaited.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testsvc.WaitFor(t, d, what, cond)
}

// FakeCarrier is the fake carrier of a test.
type FakeCarrier struct {
	*carrier.Server
	// Client calls it.
	Client *carrier.Client
	// DB is its database.
	DB *store.DB
}

// Carrier starts the fake carrier on its own database behind an HTTP
// server.
func Carrier(t testing.TB) FakeCarrier {
	t.Helper()
	db := Open(t, "carrier", carrier.Migrations())
	srv := carrier.NewServer(db, nil)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return FakeCarrier{Server: srv, Client: &carrier.Client{BaseURL: hs.URL + "/carrier"}, DB: db}
}

// OrderID returns a new order id, as the order service makes them.
func OrderID() string { return idem.NewEventID().String() }

// Event returns an event named name about the order orderID, at aggregate
// version version, with payload: a string or json.RawMessage is used as is
// (so that a test can send any bytes), anything else is encoded as JSON.
func Event(t testing.TB, name, orderID string, version int64, payload any) idem.Event {
	t.Helper()
	var raw json.RawMessage
	switch p := payload.(type) {
	case string:
		raw = json.RawMessage(p)
	case json.RawMessage:
		raw = p
	default:
		var err error
		if raw, err = json.Marshal(p); err != nil {
			t.Fatal(err)
		}
	}
	types := shop.AggregateTypes([]string{name})
	if len(types) != 1 {
		t.Fatalf("%s is not a shop event", name)
	}
	return idem.Event{ID: idem.NewEventID(), Name: name, AggregateType: types[0], AggregateID: orderID,
		AggregateVersion: version, Payload: raw}
}

// Deliver hands ev to c as a transport does (encoded, then decoded by
// Deliver), at its first attempt, and returns the consumer's verdict. It
// fails the test if the message could not even be parked.
func Deliver(t testing.TB, c *inbox.Consumer[*sql.Tx], ev idem.Event) inbox.Disposition {
	t.Helper()
	msg, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Deliver(context.Background(), inbox.Delivery{Message: msg, Source: "test", Attempt: 1})
	if err != nil {
		t.Fatalf("deliver %s: %v", ev.Name, err)
	}
	return d
}

// Applied delivers ev to c and fails the test unless it was applied.
func Applied(t testing.TB, c *inbox.Consumer[*sql.Tx], ev idem.Event) {
	t.Helper()
	if d := Deliver(t, c, ev); d.Outcome != inbox.Applied {
		t.Fatalf("%s: outcome %v (%v), want applied", ev.Name, d.Outcome, d.Err)
	}
}

// Count runs a SELECT count(*) query on db.
func Count(t testing.TB, db *store.DB, query string, args ...any) int64 {
	t.Helper()
	n, err := db.Count(context.Background(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Parked returns the number of messages in db's failure store for the
// consumer.
func Parked(t testing.TB, db *store.DB, consumer string) int64 {
	t.Helper()
	return Count(t, db, `SELECT count(*) FROM failed_message WHERE consumer_name = $1`, consumer)
}

// Outbox returns the events named name in db's outbox, in insertion order.
func Outbox(t testing.TB, db *store.DB, name string) []idem.Event {
	t.Helper()
	rows, err := db.SQL.Query(db.Q(`SELECT id, aggregatetype, aggregateid, aggregate_version, payload FROM outbox WHERE type = $1 ORDER BY seq`), name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []idem.Event
	for rows.Next() {
		var (
			id      string
			payload []byte
			ev      = idem.Event{Name: name}
		)
		if err := rows.Scan(&id, &ev.AggregateType, &ev.AggregateID, &ev.AggregateVersion, &payload); err != nil {
			t.Fatal(err)
		}
		if ev.ID, err = uuid.Parse(id); err != nil {
			t.Fatal(err)
		}
		ev.Payload = payload
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// BadOrderPlaced returns order.order.placed.v1 payloads about orderID that
// no consumer may apply, by what is wrong with them.
func BadOrderPlaced(orderID string) map[string]string {
	line := `{"productId":"p-1","quantity":"1.000"}`
	return map[string]string{
		"missing order id":    `{"customerId":"c-1","lines":[` + line + `]}`,
		"malformed order id":  `{"orderId":"42; DROP TABLE","customerId":"c-1","lines":[` + line + `]}`,
		"other order id":      `{"orderId":"` + OrderID() + `","customerId":"c-1","lines":[` + line + `]}`,
		"missing customer id": `{"orderId":"` + orderID + `","lines":[` + line + `]}`,
		"no lines":            `{"orderId":"` + orderID + `","customerId":"c-1","lines":[]}`,
		"null lines":          `{"orderId":"` + orderID + `","customerId":"c-1","lines":null}`,
		"duplicate product":   `{"orderId":"` + orderID + `","customerId":"c-1","lines":[` + line + `,` + line + `]}`,
		"negative quantity":   `{"orderId":"` + orderID + `","customerId":"c-1","lines":[{"productId":"p-1","quantity":"-7"}]}`,
		"zero quantity":       `{"orderId":"` + orderID + `","customerId":"c-1","lines":[{"productId":"p-1","quantity":"0.000"}]}`,
		"malformed quantity":  `{"orderId":"` + orderID + `","customerId":"c-1","lines":[{"productId":"p-1","quantity":"1e3"}]}`,
		"quantity as number":  `{"orderId":"` + orderID + `","customerId":"c-1","lines":[{"productId":"p-1","quantity":2}]}`,
		"order id as number":  `{"orderId":42,"customerId":"c-1","lines":[` + line + `]}`,
		"lines not a list":    `{"orderId":"` + orderID + `","customerId":"c-1","lines":"p-1"}`,
		"payload not object":  `["` + orderID + `"]`,
		"null payload":        `null`,
	}
}

// GoodOrderPlaced returns a valid order.order.placed.v1 payload about
// orderID with two lines.
func GoodOrderPlaced(orderID string) shop.OrderPlacedV1 {
	return shop.OrderPlacedV1{OrderID: orderID, CustomerID: "c-1", Lines: []shop.OrderLine{
		{ProductID: "p-1", Quantity: "2.000"}, {ProductID: "p-2", Quantity: "0.5"}}}
}
