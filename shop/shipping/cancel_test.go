package shipping

import (
	"bytes"
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/carrier"
	"github.com/idem-go/idem/shop/internal/shoptest"
)

// next delivers to c the only event named name about orderID that the
// outbox holds and that was not delivered yet (seen), and returns it.
func next(t *testing.T, s *Service, c *inbox.Consumer[*sql.Tx], name, orderID string, seen map[uuid.UUID]bool) idem.Event {
	t.Helper()
	for _, ev := range shoptest.Outbox(t, s.db, name) {
		if ev.AggregateID == orderID && !seen[ev.ID] {
			seen[ev.ID] = true
			shoptest.Applied(t, c, ev)
			return ev
		}
	}
	t.Fatalf("no new %s event for order %s in the outbox", name, orderID)
	return idem.Event{}
}

func pickups(t *testing.T, srv shoptest.FakeCarrier) carrier.Stats {
	t.Helper()
	st, err := srv.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestCancelAfterShipmentRequested is the race a cancel loses: the pickup
// was requested before the order's cancellation reached shipping. Shipping
// then cancels the preparation, publishes preparation.cancelled with the
// pickup, and its carrier consumer cancels the pickup with the key
// shipment:<order id>:cancel, records it and publishes shipment.cancelled.
// A lost answer and every kind of duplicate change nothing more.
func TestCancelAfterShipmentRequested(t *testing.T) {
	t.Parallel()
	s, db, srv := setup(t)
	id := shoptest.OrderID()
	placed, cancelled := events(t, id)
	seen := map[uuid.UUID]bool{}
	shoptest.Applied(t, s.preparation, placed)
	next(t, s, s.pickup, shop.PreparationCreated, id, seen)
	if n := shoptest.Count(t, db, `SELECT count(*) FROM shipment WHERE order_id = $1 AND cancelled_at IS NULL`, id); n != 1 {
		t.Fatalf("%d shipments before the cancellation, want 1", n)
	}

	shoptest.Applied(t, s.preparation, cancelled)
	prepCancelled := shoptest.Outbox(t, db, shop.PreparationCancelled)
	if len(prepCancelled) != 1 {
		t.Fatalf("%d preparation.cancelled events, want 1", len(prepCancelled))
	}
	p, err := inbox.DecodeJSON[shop.PreparationCancelledV1](prepCancelled[0])
	if err != nil || p.PickupID == "" || p.PreparationID == "" {
		t.Fatalf("preparation.cancelled %+v (%v), want the preparation and the pickup to cancel", p, err)
	}
	srv.DropResponses(1) // the carrier cancels, and its answer is lost
	next(t, s, s.pickup, shop.PreparationCancelled, id, seen)

	st := pickups(t, srv)
	if st.Pickups != 1 || st.Cancelled != 1 || st.Dropped != 1 {
		t.Fatalf("carrier: %+v, want 1 pickup, cancelled, after 1 lost answer", st)
	}
	var key string
	if err := srv.DB.SQL.QueryRow(srv.DB.Q(`SELECT cancel_key FROM pickup WHERE reference = $1`), id).Scan(&key); err != nil || key != CancelKey(id) {
		t.Fatalf("the pickup was cancelled with key %q (%v), want %q", key, err, CancelKey(id))
	}
	done := shoptest.Outbox(t, db, shop.ShipmentCancelled)
	if len(done) != 1 {
		t.Fatalf("%d shipment.cancelled events, want 1", len(done))
	}
	sc, err := inbox.DecodeJSON[shop.ShipmentCancelledV1](done[0])
	if err != nil || sc.PickupID != p.PickupID || sc.IdempotencyKey != CancelKey(id) {
		t.Fatalf("shipment.cancelled %+v (%v)", sc, err)
	}

	// Duplicates: the same events again, and another copy of each.
	for _, ev := range []idem.Event{cancelled, prepCancelled[0]} {
		c := s.preparation
		if ev.Name == shop.PreparationCancelled {
			c = s.pickup
		}
		if d := shoptest.Deliver(t, c, ev); d.Outcome != inbox.Duplicate {
			t.Errorf("%s again: %v, want duplicate", ev.Name, d.Outcome)
		}
		ev.ID = idem.NewEventID()
		shoptest.Applied(t, c, ev)
	}
	if st := pickups(t, srv); st.CancelRequests != 2 || st.Cancelled != 1 {
		t.Errorf("carrier after duplicates: %+v, want the 2 attempts of the first cancellation only", st)
	}
	for name, want := range map[string]int{shop.PreparationCancelled: 1, shop.ShipmentCancelled: 1} {
		if got := len(shoptest.Outbox(t, db, name)); got != want {
			t.Errorf("%d %s events after duplicates, want %d", got, name, want)
		}
	}
}

// TestCancelBeforePickup checks the race a cancel wins: the preparation is
// cancelled before the carrier consumer handles preparation.created. No
// pickup is requested, and the cancellation asks the carrier for nothing
// but a lookup.
func TestCancelBeforePickup(t *testing.T) {
	t.Parallel()
	s, db, srv := setup(t)
	id := shoptest.OrderID()
	placed, cancelled := events(t, id)
	seen := map[uuid.UUID]bool{}
	shoptest.Applied(t, s.preparation, placed)
	shoptest.Applied(t, s.preparation, cancelled)
	next(t, s, s.pickup, shop.PreparationCreated, id, seen)
	next(t, s, s.pickup, shop.PreparationCancelled, id, seen)
	if st := pickups(t, srv); st.PickupRequests != 0 || st.Pickups != 0 || st.CancelRequests != 0 {
		t.Fatalf("carrier: %+v, want nothing asked", st)
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM shipment`); n != 0 {
		t.Fatalf("%d shipments", n)
	}
	if n := len(shoptest.Outbox(t, db, shop.ShipmentCancelled)); n != 0 {
		t.Fatalf("%d shipment.cancelled events for an order never shipped", n)
	}
}

// TestCancelFindsAnUnrecordedPickup checks the case where the carrier made
// a pickup that shipping never recorded (the request's answer was lost and
// the attempt failed, then the order was cancelled): the cancellation finds
// it by reference and cancels it.
func TestCancelFindsAnUnrecordedPickup(t *testing.T) {
	t.Parallel()
	s, db, srv := setup(t)
	id := shoptest.OrderID()
	placed, cancelled := events(t, id)
	shoptest.Applied(t, s.preparation, placed)
	if _, err := s.carrier.RequestPickup(context.Background(), id, ShipmentKey(id)); err != nil {
		t.Fatal(err)
	}
	seen := map[uuid.UUID]bool{}
	shoptest.Applied(t, s.preparation, cancelled)
	next(t, s, s.pickup, shop.PreparationCreated, id, seen) // the retry after the cancellation: no request
	next(t, s, s.pickup, shop.PreparationCancelled, id, seen)
	if st := pickups(t, srv); st.Pickups != 1 || st.Cancelled != 1 {
		t.Fatalf("carrier: %+v, want its pickup cancelled", st)
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM shipment WHERE order_id = $1 AND cancelled_at IS NOT NULL`, id); n != 1 {
		t.Fatalf("%d cancelled shipments recorded, want 1", n)
	}
	if n := len(shoptest.Outbox(t, db, shop.ShipmentCancelled)); n != 1 {
		t.Fatalf("%d shipment.cancelled events, want 1", n)
	}
}

// TestCancelDuringPickupRequest runs the cancellation while the carrier is
// answering the pickup request: the cancellation waits for it (the
// preparation's lock), sees the shipment, and the pickup is cancelled.
func TestCancelDuringPickupRequest(t *testing.T) {
	t.Parallel()
	db := shoptest.Open(t, "shipping", Migrations())
	srv := shoptest.Carrier(t)
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/carrier/pickups" {
			once.Do(func() { close(arrived); <-release })
		}
		srv.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(slow.Close)
	s, err := New(db, &carrier.Client{BaseURL: slow.URL + "/carrier"}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	id := shoptest.OrderID()
	placed, cancelled := events(t, id)
	shoptest.Applied(t, s.preparation, placed)
	created := shoptest.Outbox(t, db, shop.PreparationCreated)

	// A failure while the carrier holds the request must not leave it, and
	// the server's Close, waiting.
	var released sync.Once
	releaseCarrier := func() { released.Do(func() { close(release) }) }
	t.Cleanup(releaseCarrier)

	var wg sync.WaitGroup
	wg.Go(func() { shoptest.Applied(t, s.pickup, created[0]) })
	<-arrived
	cancelDone := make(chan struct{})
	wg.Go(func() {
		defer close(cancelDone)
		shoptest.Applied(t, s.preparation, cancelled)
	})
	// SQLite lists no lock waits, but the goroutine of a statement that
	// waits for the lock runs the driver's busy handler.
	shoptest.WaitFor(t, 30*time.Second, "the cancellation waiting for the preparation's lock", func() bool {
		select {
		case <-cancelDone:
			t.Fatal("the cancellation ended while the pickup request held the preparation's lock")
		default:
		}
		return waitsForLock("TestCancelDuringPickupRequest")
	})
	releaseCarrier()
	wg.Wait()

	seen := map[uuid.UUID]bool{created[0].ID: true}
	ev := next(t, s, s.pickup, shop.PreparationCancelled, id, seen)
	if p, err := inbox.DecodeJSON[shop.PreparationCancelledV1](ev); err != nil || p.PickupID == "" {
		t.Errorf("preparation.cancelled %+v (%v): the cancellation did not see the pickup it waited for", p, err)
	}
	if st := pickups(t, srv); st.Pickups != 1 || st.Cancelled != 1 {
		t.Fatalf("carrier: %+v, want the pickup made and cancelled", st)
	}
}

// waitsForLock reports whether a goroutine started by the test named test
// waits for SQLite's lock, in the busy handler of modernc.org/sqlite.
func waitsForLock(test string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("modernc.org/sqlite.busyHandler")) && bytes.Contains(g, []byte("."+test+".")) {
			return true
		}
	}
	return false
}
