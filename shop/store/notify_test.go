package store

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// TestNotifyWakesTheRelay: a relay that polls once a minute publishes a row
// at once when the service's code calls Notify after its commit, and not
// before. Notify does nothing on a database without a relay.
//
// The relay's counters say when its one worker sleeps: once the claim that
// took fewer rows than a batch has published them. From then on only Notify
// may wake it: no claim may come before Notify, and the second row must be
// published after it.
func TestNotifyWakesTheRelay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := openOrderDB(ctx, t)
	db.Notify() // no relay: nothing happens
	w := outbox.NewWriter(db.Driver)
	write := func(id string) { t.Helper(); writeOrderPlaced(t, db, w, id) }
	pub := &notePublisher{Publisher: memory.New()}
	eventually := func(within time.Duration, cond func() bool) bool {
		deadline := time.Now().Add(within)
		for !cond() {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(5 * time.Millisecond)
		}
		return true
	}

	// The first row is there when the relay starts: its first claim takes
	// it, fewer rows than a batch, and its one worker sleeps for a minute.
	write("1")
	r, err := db.NewRelay(pub, relay.Config{Workers: 1, PollInterval: time.Minute, MaxPollInterval: time.Minute, StatsInterval: -1, Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	if !eventually(10*time.Second, func() bool { return r.Stats().Published == 1 }) {
		t.Fatal("the first row was not published")
	}
	asleep := r.Stats()
	write("2")
	if s := r.Stats(); s.Claims != asleep.Claims || s.EmptyClaims != asleep.EmptyClaims {
		t.Fatalf("the relay claimed without a Notify after a claim took fewer rows than a batch (%d claims, %d empty, then %d and %d): it was not asleep",
			asleep.Claims, asleep.EmptyClaims, s.Claims, s.EmptyClaims)
	}
	start := time.Now()
	pub.notified.Store(true)
	db.Notify()
	if !eventually(10*time.Second, func() bool { return len(pub.Messages()) >= 2 }) {
		t.Fatal("the second row was not published after Notify")
	}
	t.Logf("published %v after Notify", time.Since(start))
	if n := pub.early.Load(); n != 1 {
		t.Errorf("%d rows published before Notify, want only the first", n)
	}
	// Over the relay's whole life, stopped now: one claim per row, each
	// followed by a minute's sleep, which only Notify cut short.
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := r.Stats(); s.Claims != 2 || s.EmptyClaims != 0 {
		t.Errorf("the relay claimed %d times, %d of them finding nothing; want 2 claims, one per row: a relay that polls once a minute claimed without a Notify", s.Claims+s.EmptyClaims, s.EmptyClaims)
	}
}

// notePublisher counts the messages published before notified is set.
type notePublisher struct {
	*memory.Publisher
	notified atomic.Bool
	early    atomic.Int64
}

func (p *notePublisher) Publish(ctx context.Context, msgs []idem.Message) error {
	if !p.notified.Load() {
		p.early.Add(int64(len(msgs)))
	}
	return p.Publisher.Publish(ctx, msgs)
}

// TestNotifyIfAdded: the writers of OutboxWriter count their inserts, and
// NotifyIfAdded wakes the relay only after work that inserted rows: an
// order retried with the same Idempotency-Key, or a delivery whose handler
// writes no event, costs the relay no claim.
func TestNotifyIfAdded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := openOrderDB(ctx, t)
	notified := 0
	notify := func() { notified++ }
	db.notify.Store(&notify)

	before := db.OutboxAdds()
	db.NotifyIfAdded(before)
	if notified != 0 {
		t.Fatalf("NotifyIfAdded with no insert notified %d times", notified)
	}
	writeOrderPlaced(t, db, db.OutboxWriter(), "1")
	if got := db.OutboxAdds(); got != before+1 {
		t.Fatalf("OutboxAdds = %d after one Add, want %d", got, before+1)
	}
	db.NotifyIfAdded(before)
	if notified != 1 {
		t.Fatalf("NotifyIfAdded after an insert notified %d times, want 1", notified)
	}
	db.NotifyIfAdded(db.OutboxAdds())
	if notified != 1 {
		t.Fatalf("NotifyIfAdded with nothing inserted since notified again (%d)", notified)
	}
}

// writeOrderPlaced commits an order placed event for order id through w.
func writeOrderPlaced(t *testing.T, db *DB, w *outbox.Writer[*sql.Tx], id string) {
	t.Helper()
	ctx := context.Background()
	ev, err := idem.NewEvent("order.order.placed.v1", "order", id, map[string]string{"order_id": id})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Driver.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(ctx, tx, ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// openOrderDB opens and migrates an order database in a SQLite file of the
// test's.
func openOrderDB(ctx context.Context, t *testing.T) *DB {
	t.Helper()
	db, err := Open(ctx, "order", "sqlite:"+t.TempDir(), "shop_order", Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := db.Migrate(ctx, Migrations{SQLite: nil}, nil); err != nil {
		t.Fatal(err)
	}
	return db
}
