package shipping

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/carrier"
	"github.com/idem-go/idem/shop/internal/shoptest"
	"github.com/idem-go/idem/shop/store"
)

func setup(t *testing.T) (*Service, *store.DB, shoptest.FakeCarrier) {
	t.Helper()
	db := shoptest.Open(t, "shipping", Migrations())
	c := shoptest.Carrier(t)
	s, err := New(db, c.Client, Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s, db, c
}

func events(t *testing.T, orderID string) (placed, cancelled idem.Event) {
	t.Helper()
	placed = shoptest.Event(t, shop.OrderPlaced, orderID, 1, shop.OrderPlacedV1{
		OrderID: orderID, CustomerID: "c-1", Lines: []shop.OrderLine{{ProductID: "p-1", Quantity: "1.000"}}})
	cancelled = shoptest.Event(t, shop.OrderCancelled, orderID, 2, shop.OrderCancelledV1{OrderID: orderID})
	return placed, cancelled
}

// TestCancellationInEitherOrder checks that a cancelled order never keeps
// an active preparation, whether OrderCancelled arrives after or before
// OrderPlaced, and that duplicates change nothing.
func TestCancellationInEitherOrder(t *testing.T) {
	t.Parallel()
	s, db, _ := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		cancelFirst   bool
		wantPrepCount int64
	}{{"placed then cancelled", false, 1}, {"cancelled then placed", true, 0}} {
		id := shoptest.OrderID()
		placed, cancelled := events(t, id)
		order := []idem.Event{placed, cancelled, placed, cancelled}
		if tc.cancelFirst {
			order = []idem.Event{cancelled, placed, cancelled, placed}
		}
		for _, ev := range order {
			if _, err := s.preparation.Process(ctx, ev); err != nil {
				t.Fatalf("%s: %s: %v", tc.name, ev.Name, err)
			}
		}
		active := shoptest.Count(t, db, `SELECT count(*) FROM preparation WHERE order_id = $1 AND status = 'active'`, id)
		if active != 0 {
			t.Errorf("%s: %d active preparations, want 0", tc.name, active)
		}
		if all := shoptest.Count(t, db, `SELECT count(*) FROM preparation WHERE order_id = $1`, id); all != tc.wantPrepCount {
			t.Errorf("%s: %d preparations, want %d", tc.name, all, tc.wantPrepCount)
		}
		var status string
		if err := db.SQL.QueryRow(db.Q(`SELECT status FROM order_status WHERE order_id = $1`), id).Scan(&status); err != nil || status != "cancelled" {
			t.Errorf("%s: order_status %q (%v), want cancelled", tc.name, status, err)
		}
	}
}

// TestTwoEventsOnePreparation checks the business key: two different
// events asking for the same order's preparation make one.
func TestTwoEventsOnePreparation(t *testing.T) {
	t.Parallel()
	s, db, _ := setup(t)
	ctx := context.Background()
	id := shoptest.OrderID()
	a, _ := events(t, id)
	b, _ := events(t, id)
	for _, ev := range []idem.Event{a, b} {
		if o, err := s.preparation.Process(ctx, ev); err != nil || o != inbox.Applied {
			t.Fatalf("%v %v", o, err)
		}
	}
	n := shoptest.Count(t, db, `SELECT count(*) FROM preparation WHERE order_id = $1`, id)
	m := shoptest.Count(t, db, `SELECT count(*) FROM outbox WHERE type = $1`, shop.PreparationCreated)
	if n != 1 || m != 1 {
		t.Fatalf("%d preparations and %d preparation.created events, want 1 and 1", n, m)
	}
}

// TestImpossibleEventsAreParked checks both shipping consumers: impossible
// orders make no preparation, an impossible cancellation cancels nothing,
// an impossible preparation.created asks the carrier for nothing; all are
// parked. Good events are applied.
func TestImpossibleEventsAreParked(t *testing.T) {
	t.Parallel()
	s, db, carrierSrv := setup(t)
	// Each impossible event is about an order of its own: a parked event
	// holds the later events of its order.
	bad := shoptest.BadOrderPlaced(shoptest.OrderID())
	for what := range bad {
		bid := shoptest.OrderID()
		d := shoptest.Deliver(t, s.preparation, shoptest.Event(t, shop.OrderPlaced, bid, 1, shoptest.BadOrderPlaced(bid)[what]))
		if d.Outcome != inbox.Parked || !idem.IsPermanent(d.Err) {
			t.Errorf("order placed, %s: outcome %v (%v), want parked", what, d.Outcome, d.Err)
		}
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM preparation`); n != 0 {
		t.Fatalf("%d preparations from impossible orders", n)
	}
	id := shoptest.OrderID()
	shoptest.Applied(t, s.preparation, shoptest.Event(t, shop.OrderPlaced, id, 1, shoptest.GoodOrderPlaced(id)))

	prep := idem.NewEventID().String()
	badCancels := func(id string) map[string]idem.Event {
		return map[string]idem.Event{
			"cancelled, no order id":      shoptest.Event(t, shop.OrderCancelled, id, 2, `{}`),
			"cancelled, malformed id":     shoptest.Event(t, shop.OrderCancelled, id, 2, `{"orderId":"`+id+`x"}`),
			"cancelled, id as number":     shoptest.Event(t, shop.OrderCancelled, id, 2, `{"orderId":7}`),
			"cancelled, another order":    shoptest.Event(t, shop.OrderCancelled, id, 2, shop.OrderCancelledV1{OrderID: shoptest.OrderID()}),
			"cancelled, payload a string": shoptest.Event(t, shop.OrderCancelled, id, 2, `"`+id+`"`),
		}
	}
	for what := range badCancels("") {
		ev := badCancels(shoptest.OrderID())[what]
		d := shoptest.Deliver(t, s.preparation, ev)
		if d.Outcome != inbox.Parked || !idem.IsPermanent(d.Err) {
			t.Errorf("%s: outcome %v (%v), want parked", what, d.Outcome, d.Err)
		}
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM preparation WHERE status = 'active'`); n != 1 {
		t.Fatalf("%d active preparations after impossible cancellations, want 1", n)
	}
	badCreated := func(id string) map[string]idem.Event {
		return map[string]idem.Event{
			"no order id":          shoptest.Event(t, shop.PreparationCreated, id, 0, `{"preparationId":"`+prep+`"}`),
			"no preparation id":    shoptest.Event(t, shop.PreparationCreated, id, 0, `{"orderId":"`+id+`"}`),
			"malformed order id":   shoptest.Event(t, shop.PreparationCreated, id, 0, `{"orderId":"../../x","preparationId":"`+prep+`"}`),
			"preparation a number": shoptest.Event(t, shop.PreparationCreated, id, 0, `{"orderId":"`+id+`","preparationId":1}`),
		}
	}
	for what := range badCreated("") {
		ev := badCreated(shoptest.OrderID())[what]
		d := shoptest.Deliver(t, s.pickup, ev)
		if d.Outcome != inbox.Parked || !idem.IsPermanent(d.Err) {
			t.Errorf("preparation created, %s: outcome %v (%v), want parked", what, d.Outcome, d.Err)
		}
	}
	st, err := carrierSrv.Stats(context.Background())
	if err != nil || st.PickupRequests != 0 {
		t.Fatalf("the carrier got %d pickup requests for impossible events (%v)", st.PickupRequests, err)
	}
	want := int64(len(bad) + 5 + 4)
	if n := shoptest.Parked(t, db, PreparationConsumer) + shoptest.Parked(t, db, CarrierConsumer); n != want {
		t.Fatalf("%d parked messages, want %d", n, want)
	}

	created := shoptest.Outbox(t, db, shop.PreparationCreated)
	if len(created) != 1 {
		t.Fatalf("%d preparation.created events, want 1", len(created))
	}
	shoptest.Applied(t, s.pickup, created[0])
	if n := shoptest.Count(t, db, `SELECT count(*) FROM shipment WHERE order_id = $1`, id); n != 1 {
		t.Fatalf("%d shipments, want 1", n)
	}
}

// TestCarrierAwayIsTransient checks that a carrier that cannot be reached
// makes the pickup request fail as transient (the consumer waits and
// retries, and parks nothing), with nothing written.
func TestCarrierAwayIsTransient(t *testing.T) {
	t.Parallel()
	db := shoptest.Open(t, "shipping", Migrations())
	s, err := New(db, &carrier.Client{BaseURL: "http://127.0.0.1:1/carrier"}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	id := shoptest.OrderID()
	shoptest.Applied(t, s.preparation, shoptest.Event(t, shop.OrderPlaced, id, 1, shoptest.GoodOrderPlaced(id)))
	created := shoptest.Outbox(t, db, shop.PreparationCreated)
	if len(created) != 1 {
		t.Fatalf("%d preparation.created events, want 1", len(created))
	}
	o, err := s.pickup.Process(context.Background(), created[0])
	if o != inbox.Failed || !idem.IsTransient(err) || idem.IsPermanent(err) {
		t.Fatalf("carrier away: %v %v, want a transient failure", o, err)
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM shipment`) + shoptest.Count(t, db,
		`SELECT count(*) FROM processed_event WHERE consumer_name = $1`, CarrierConsumer); n != 0 {
		t.Fatalf("%d shipments or markers written by a failed attempt", n)
	}
}

// TestAnnouncedPreparationNotFoundWaits checks that a preparation.created
// whose preparation the consumer cannot find (not visible yet, as on a
// replica behind its primary) is a transient failure: nothing parked,
// nothing asked of the carrier, the event tried again later.
func TestAnnouncedPreparationNotFoundWaits(t *testing.T) {
	t.Parallel()
	s, db, carrierSrv := setup(t)
	id := shoptest.OrderID()
	ev := shoptest.Event(t, shop.PreparationCreated, id, 0, shop.PreparationCreatedV1{OrderID: id, PreparationID: idem.NewEventID().String()})
	o, err := s.pickup.Process(context.Background(), ev)
	if o != inbox.Failed || !idem.IsTransient(err) || idem.IsPermanent(err) {
		t.Fatalf("preparation not found: %v %v, want a transient failure", o, err)
	}
	if d := shoptest.Deliver(t, s.pickup, ev); d.Outcome != inbox.Paused {
		t.Errorf("delivered: outcome %v (%v), want paused", d.Outcome, d.Err)
	}
	if n := shoptest.Parked(t, db, CarrierConsumer); n != 0 {
		t.Errorf("%d messages parked", n)
	}
	st, err := carrierSrv.Stats(context.Background())
	if err != nil || st.PickupRequests != 0 {
		t.Fatalf("the carrier got %d pickup requests (%v)", st.PickupRequests, err)
	}
}
