package stock

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/internal/shoptest"
	"github.com/idem-go/idem/shop/store"
)

func setup(t *testing.T) (*Service, *store.DB) {
	t.Helper()
	db := shoptest.Open(t, "stock", Migrations())
	s, err := New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

// TestImpossibleOrdersAreParked checks that an order.order.placed.v1 that
// the order API would have refused (a quantity of -7, no lines, a product
// twice...) is parked in the failure store and reserves nothing, and that
// a good one reserves every line.
func TestImpossibleOrdersAreParked(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	// Each impossible event is about an order of its own: a parked event
	// holds the later events of its order.
	bad := shoptest.BadOrderPlaced(shoptest.OrderID())
	for what := range bad {
		bid := shoptest.OrderID()
		d := shoptest.Deliver(t, s.Consumer(), shoptest.Event(t, shop.OrderPlaced, bid, 1, shoptest.BadOrderPlaced(bid)[what]))
		if d.Outcome != inbox.Parked || !idem.IsPermanent(d.Err) {
			t.Errorf("%s: outcome %v (%v), want parked with a permanent error", what, d.Outcome, d.Err)
		}
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM reservation`); n != 0 {
		t.Fatalf("%d reservations from impossible orders", n)
	}
	if n := shoptest.Parked(t, db, ConsumerName); n != int64(len(bad)) {
		t.Fatalf("%d parked messages, want %d", n, len(bad))
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM processed_event`); n != 0 {
		t.Fatalf("%d processed_event markers for parked messages", n)
	}

	id := shoptest.OrderID()
	shoptest.Applied(t, s.Consumer(), shoptest.Event(t, shop.OrderPlaced, id, 1, shoptest.GoodOrderPlaced(id)))
	for product, q := range map[string]string{"p-1": "2.000", "p-2": "0.500"} {
		if n := shoptest.Count(t, db, `SELECT count(*) FROM reservation WHERE order_id = $1 AND product_id = $2 AND quantity = $3`, id, product, q); n != 1 {
			t.Errorf("%d reservations of %s %s, want 1", n, q, product)
		}
	}
}

// TestCancelReleases checks that a cancellation releases every reservation
// of the order once, whatever the duplicates, and that an order placed
// event handled after its cancellation reserves nothing.
func TestCancelReleases(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	id := shoptest.OrderID()
	placed := shoptest.Event(t, shop.OrderPlaced, id, 1, shoptest.GoodOrderPlaced(id))
	cancelled := shoptest.Event(t, shop.OrderCancelled, id, 2, shop.OrderCancelledV1{OrderID: id})
	shoptest.Applied(t, s.Consumer(), placed)
	shoptest.Applied(t, s.Consumer(), cancelled)
	if d := shoptest.Deliver(t, s.Consumer(), cancelled); d.Outcome != inbox.Duplicate {
		t.Fatalf("cancellation again: %v, want duplicate", d.Outcome)
	}
	count := func(where string) int64 {
		return shoptest.Count(t, db, `SELECT count(*) FROM reservation WHERE order_id = $1 AND `+where, id)
	}
	if held, released := count("released_at IS NULL"), count("released_at IS NOT NULL"); held != 0 || released != 2 {
		t.Fatalf("%d reservations held and %d released, want 0 and 2", held, released)
	}

	late := shoptest.OrderID()
	shoptest.Applied(t, s.Consumer(), shoptest.Event(t, shop.OrderCancelled, late, 2, shop.OrderCancelledV1{OrderID: late}))
	shoptest.Applied(t, s.Consumer(), shoptest.Event(t, shop.OrderPlaced, late, 1, shoptest.GoodOrderPlaced(late)))
	if n := shoptest.Count(t, db, `SELECT count(*) FROM reservation WHERE order_id = $1`, late); n != 0 {
		t.Fatalf("%d reservations for an order placed after its cancellation", n)
	}

	for what, payload := range map[string]string{"no order id": `{}`, "malformed order id": `{"orderId":"x"}`} {
		d := shoptest.Deliver(t, s.Consumer(), shoptest.Event(t, shop.OrderCancelled, id, 3, payload))
		if d.Outcome != inbox.Parked {
			t.Errorf("cancellation, %s: %v, want parked", what, d.Outcome)
		}
	}
}
