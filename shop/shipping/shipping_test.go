package shipping

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/carrier"
	"github.com/idem-go/idem/shop/store"
)

func setup(t *testing.T) (*Service, *store.DB) {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "shipping_t_" + hex.EncodeToString(b)
	ctx := context.Background()
	db, err := store.Open(ctx, "shipping", testdb.PostgresURL(t), schema, store.Options{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.SQL.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
		db.Close()
	})
	if err := db.Migrate(ctx, Migrations(), nil); err != nil {
		t.Fatal(err)
	}
	s, err := New(db, &carrier.Client{BaseURL: "http://127.0.0.1:1/carrier"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

func events(t *testing.T, orderID string) (placed, cancelled idem.Event) {
	t.Helper()
	placed, err := idem.NewEvent(shop.OrderPlaced, shop.AggregateOrder, orderID, shop.OrderPlacedV1{
		OrderID: orderID, CustomerID: "c-1", Lines: []shop.OrderLine{{ProductID: "p-1", Quantity: "1.000"}}})
	if err != nil {
		t.Fatal(err)
	}
	placed.AggregateVersion = 1
	cancelled, err = idem.NewEvent(shop.OrderCancelled, shop.AggregateOrder, orderID, shop.OrderCancelledV1{OrderID: orderID})
	if err != nil {
		t.Fatal(err)
	}
	cancelled.AggregateVersion = 2
	return placed, cancelled
}

// TestCancellationInEitherOrder checks that a cancelled order never keeps
// an active preparation, whether OrderCancelled arrives after or before
// OrderPlaced, and that duplicates change nothing.
func TestCancellationInEitherOrder(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		cancelFirst   bool
		wantPrepCount int64
	}{{"placed then cancelled", false, 1}, {"cancelled then placed", true, 0}} {
		id := "order-" + tc.name
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
		active, err := db.Count(ctx, `SELECT count(*) FROM preparation WHERE order_id = $1 AND status = 'active'`, id)
		if err != nil || active != 0 {
			t.Errorf("%s: %d active preparations (%v), want 0", tc.name, active, err)
		}
		all, _ := db.Count(ctx, `SELECT count(*) FROM preparation WHERE order_id = $1`, id)
		if all != tc.wantPrepCount {
			t.Errorf("%s: %d preparations, want %d", tc.name, all, tc.wantPrepCount)
		}
		var status string
		if err := db.SQL.QueryRow(`SELECT status FROM order_status WHERE order_id = $1`, id).Scan(&status); err != nil || status != "cancelled" {
			t.Errorf("%s: order_status %q (%v), want cancelled", tc.name, status, err)
		}
	}
}

// TestTwoEventsOnePreparation checks the business key: two different
// events asking for the same order's preparation make one.
func TestTwoEventsOnePreparation(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	a, _ := events(t, "order-42")
	b, _ := events(t, "order-42")
	for _, ev := range []idem.Event{a, b} {
		if o, err := s.preparation.Process(ctx, ev); err != nil || o != inbox.Applied {
			t.Fatalf("%v %v", o, err)
		}
	}
	n, _ := db.Count(ctx, `SELECT count(*) FROM preparation WHERE order_id = 'order-42'`)
	m, _ := db.Count(ctx, `SELECT count(*) FROM outbox WHERE type = $1`, shop.PreparationCreated)
	if n != 1 || m != 1 {
		t.Fatalf("%d preparations and %d preparation.created events, want 1 and 1", n, m)
	}
}
