package order

import (
	"context"
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
	bad := map[string]idem.Event{
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
	for what, ev := range bad {
		d := shoptest.Deliver(t, s.Consumer(), ev)
		if d.Outcome != inbox.Parked || !idem.IsPermanent(d.Err) {
			t.Errorf("%s: outcome %v (%v), want parked", what, d.Outcome, d.Err)
		}
	}
	if n := shoptest.Parked(t, db, ConsumerName); n != int64(len(bad)) {
		t.Fatalf("%d parked, want %d", n, len(bad))
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
