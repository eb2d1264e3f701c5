package order

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/internal/shoptest"
	"github.com/idem-go/idem/shop/store"
)

// setupSQLite is setup on a SQLite file: for the tests that do not depend
// on the dialect.
func setupSQLite(t *testing.T, cfg Config) (*Service, *httptest.Server, *store.DB) {
	t.Helper()
	db := shoptest.Open(t, "order", Migrations())
	s, err := New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv, db
}

func placeJSON(t *testing.T, url string) Order {
	t.Helper()
	r := post(t, url, "", body1)
	if r.status != http.StatusCreated {
		t.Fatalf("place: %d %s", r.status, r.body)
	}
	return r.order
}

// TestConsumerParksImpossibleEvents checks that shipping's events with
// impossible payloads are parked and change no order, and that good ones
// move the fulfilment.
func TestConsumerParksImpossibleEvents(t *testing.T) {
	t.Parallel()
	s, srv, db := setupSQLite(t, Config{})
	id := placeJSON(t, srv.URL).ID
	prep := idem.NewEventID().String()
	// Each impossible event is about an order of its own: a parked event
	// holds the later events of its order.
	bad := func(id string) map[string]idem.Event {
		return map[string]idem.Event{
			"created, no order id":        shoptest.Event(t, shop.PreparationCreated, id, 0, `{"preparationId":"`+prep+`"}`),
			"created, malformed order id": shoptest.Event(t, shop.PreparationCreated, id, 0, `{"orderId":"x","preparationId":"`+prep+`"}`),
			"created, no preparation id":  shoptest.Event(t, shop.PreparationCreated, id, 0, `{"orderId":"`+id+`"}`),
			"created, another order":      shoptest.Event(t, shop.PreparationCreated, id, 0, shop.PreparationCreatedV1{OrderID: shoptest.OrderID(), PreparationID: prep}),
			"requested, no pickup":        shoptest.Event(t, shop.ShipmentRequested, id, 0, `{"orderId":"`+id+`","idempotencyKey":"k"}`),
			"requested, pickup a number":  shoptest.Event(t, shop.ShipmentRequested, id, 0, `{"orderId":"`+id+`","pickupId":7,"idempotencyKey":"k"}`),
			"requested, bad pickup":       shoptest.Event(t, shop.ShipmentRequested, id, 0, `{"orderId":"`+id+`","pickupId":"a b","idempotencyKey":"k"}`),
			"cancelled, no order id":      shoptest.Event(t, shop.PreparationCancelled, id, 0, `{"preparationId":"`+prep+`"}`),
			"cancelled, payload a list":   shoptest.Event(t, shop.PreparationCancelled, id, 0, `[]`),
		}
	}
	cases := bad(shoptest.OrderID())
	for what := range cases {
		ev := bad(shoptest.OrderID())[what]
		d := shoptest.Deliver(t, s.Consumer(), ev)
		if d.Outcome != inbox.Parked || !idem.IsPermanent(d.Err) {
			t.Errorf("%s: outcome %v (%v), want parked", what, d.Outcome, d.Err)
		}
	}
	if n := shoptest.Parked(t, db, ConsumerName); n != int64(len(cases)) {
		t.Fatalf("%d parked, want %d", n, len(cases))
	}
	o, err := s.Get(context.Background(), id)
	if err != nil || o.Fulfilment != FulfilmentAwaiting {
		t.Fatalf("order after impossible events: %+v %v", o, err)
	}
	shoptest.Applied(t, s.Consumer(), shoptest.Event(t, shop.PreparationCreated, id, 0, shop.PreparationCreatedV1{OrderID: id, PreparationID: prep}))
	shoptest.Applied(t, s.Consumer(), shoptest.Event(t, shop.ShipmentRequested, id, 0,
		shop.ShipmentRequestedV1{OrderID: id, PickupID: "pk-1", IdempotencyKey: "shipment:" + id + ":initial"}))
	if o, err = s.Get(context.Background(), id); err != nil || o.Fulfilment != FulfilmentShipment || o.PickupID != "pk-1" {
		t.Fatalf("order after good events: %+v %v", o, err)
	}
}

func cancelOrder(t *testing.T, url, id string) (int, Order) {
	t.Helper()
	resp, err := http.Post(url+"/orders/"+id+"/cancel", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var o Order
	_ = json.NewDecoder(resp.Body).Decode(&o)
	return resp.StatusCode, o
}

// TestCancelAfterShipment checks the cancellation of an order whose pickup
// was requested: the cancel is accepted, publishes one
// order.order.cancelled.v1, and the fulfilment then follows shipping's
// compensation to "shipment cancelled", keeping the pickup id.
func TestCancelAfterShipment(t *testing.T) {
	t.Parallel()
	s, srv, db := setupSQLite(t, Config{})
	id := placeJSON(t, srv.URL).ID
	prep := idem.NewEventID().String()
	shoptest.Applied(t, s.Consumer(), shoptest.Event(t, shop.PreparationCreated, id, 0, shop.PreparationCreatedV1{OrderID: id, PreparationID: prep}))
	shoptest.Applied(t, s.Consumer(), shoptest.Event(t, shop.ShipmentRequested, id, 0,
		shop.ShipmentRequestedV1{OrderID: id, PickupID: "pk-1", IdempotencyKey: "shipment:" + id + ":initial"}))

	for i := range 2 {
		status, o := cancelOrder(t, srv.URL, id)
		if status != http.StatusOK || o.Status != StatusCancelled || o.Fulfilment != FulfilmentShipment || o.Version != 2 {
			t.Fatalf("cancel %d: %d %+v, want the order cancelled, its fulfilment as shipping left it", i+1, status, o)
		}
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM outbox WHERE type = $1 AND aggregateid = $2`, shop.OrderCancelled, id); n != 1 {
		t.Fatalf("%d order.cancelled events after two cancels, want 1", n)
	}
	if status, _ := cancelOrder(t, srv.URL, shoptest.OrderID()); status != http.StatusNotFound {
		t.Fatalf("cancel of an unknown order: %d, want 404", status)
	}

	for _, step := range []struct {
		ev   idem.Event
		want string
	}{
		{shoptest.Event(t, shop.PreparationCancelled, id, 0, shop.PreparationCancelledV1{OrderID: id, PreparationID: prep, PickupID: "pk-1"}), FulfilmentCancellingShipment},
		{shoptest.Event(t, shop.ShipmentCancelled, id, 0, shop.ShipmentCancelledV1{OrderID: id, PickupID: "pk-1", IdempotencyKey: "shipment:" + id + ":cancel"}), FulfilmentShipmentCancelled},
		// A late copy of an earlier event changes nothing.
		{shoptest.Event(t, shop.ShipmentRequested, id, 0, shop.ShipmentRequestedV1{OrderID: id, PickupID: "pk-1", IdempotencyKey: "k"}), FulfilmentShipmentCancelled},
	} {
		shoptest.Applied(t, s.Consumer(), step.ev)
		o, err := s.Get(context.Background(), id)
		if err != nil || o.Fulfilment != step.want || o.PickupID != "pk-1" || o.Status != StatusCancelled {
			t.Fatalf("after %s: %+v %v, want fulfilment %q", step.ev.Name, o, err, step.want)
		}
	}

	// Cancelled before any pickup: "cancelled".
	other := placeJSON(t, srv.URL).ID
	cancelOrder(t, srv.URL, other)
	shoptest.Applied(t, s.Consumer(), shoptest.Event(t, shop.PreparationCancelled, other, 0, shop.PreparationCancelledV1{OrderID: other}))
	if o, err := s.Get(context.Background(), other); err != nil || o.Fulfilment != FulfilmentCancelled {
		t.Fatalf("cancelled before any pickup: %+v %v", o, err)
	}
}
