package store

import (
	"context"
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
func TestNotifyWakesTheRelay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := Open(ctx, "order", "sqlite:"+t.TempDir(), "shop_order", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Migrate(ctx, Migrations{SQLite: nil}, nil); err != nil {
		t.Fatal(err)
	}
	db.Notify() // no relay: nothing happens
	w := outbox.NewWriter(db.Driver)
	write := func(id string) {
		t.Helper()
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
	pub := memory.New()
	published := func(n int, within time.Duration) bool {
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			if len(pub.Messages()) >= n {
				return true
			}
			time.Sleep(5 * time.Millisecond)
		}
		return false
	}

	// The first row is there when the relay starts: its first claim takes
	// it, then its one worker sleeps for a minute.
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
	if !published(1, 10*time.Second) {
		t.Fatal("the first row was not published")
	}
	write("2")
	if published(2, 300*time.Millisecond) {
		t.Fatal("the second row was published without a Notify: the relay was not asleep, the test proves nothing")
	}
	start := time.Now()
	db.Notify()
	if !published(2, 10*time.Second) {
		t.Fatal("the second row was not published after Notify")
	}
	t.Logf("published %v after Notify", time.Since(start))
}
