package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

func TestStateCopyAppliesOnlyNewerVersions(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `CREATE TABLE order_status (order_id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)`)
	copyOf := inbox.StateCopy{Table: pg.Schema + ".order_status", Key: "order_id", Columns: []string{"status"}}
	ctx := context.Background()
	apply := func(version int64, status string) inbox.VersionResult {
		t.Helper()
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		res, err := inbox.ApplyState(ctx, pg.Driver, tx, copyOf, "42", version, status)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return res
	}

	if r := apply(1, "confirmed"); !r.Applied || r.Previous != 0 || r.Gap {
		t.Errorf("v1 = %+v, want applied, no previous, no gap", r)
	}
	if r := apply(3, "cancelled"); !r.Applied || r.Previous != 1 || !r.Gap {
		t.Errorf("v3 after v1 = %+v, want applied with a gap from 1", r)
	}
	if r := apply(2, "in preparation"); r.Applied || !r.Stale() {
		t.Errorf("late v2 = %+v, want stale (nothing changed)", r)
	}
	if r := apply(3, "cancelled"); r.Applied {
		t.Errorf("same version again = %+v, want stale", r)
	}
	var status string
	var version int64
	if err := pg.Pool.QueryRow(ctx, `SELECT status, version FROM order_status WHERE order_id = '42'`).Scan(&status, &version); err != nil {
		t.Fatal(err)
	}
	if version != 3 || status != "cancelled" {
		t.Errorf("state = %q v%d, want cancelled v3", status, version)
	}
	if r := apply(4, "shipped"); !r.Applied || r.Gap || r.Previous != 3 {
		t.Errorf("v4 = %+v, want applied without gap", r)
	}
}

func TestStateCopyInHandler(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `CREATE TABLE order_status (order_id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)`)
	c, err := inbox.New(pg.Driver, inbox.Config{Name: "shipping"})
	if err != nil {
		t.Fatal(err)
	}
	orderStatus := inbox.StateCopy{Table: "order_status", Key: "order_id", Columns: []string{"status"}}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		_, err := inbox.ApplyState(ctx, c.Driver(), tx, orderStatus, ev.AggregateID, ev.AggregateVersion, ev.Name)
		return err
	})
	ctx := context.Background()
	for _, v := range []int64{1, 3, 2} {
		ev := placed(t, "42")
		ev.AggregateVersion = v
		ev.Name = []string{"", "placed", "paid", "cancelled"}[v]
		if o, err := c.Process(ctx, ev); o != inbox.Applied || err != nil {
			t.Fatalf("v%d: %v, %v", v, o, err)
		}
	}
	var status string
	if err := pg.Pool.QueryRow(ctx, `SELECT status FROM order_status`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "cancelled" {
		t.Errorf("status = %q, want the v3 state \"cancelled\"", status)
	}
}

func TestPurge(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	ctx := context.Background()
	now := time.Now()
	// 25 old markers of stock, 5 old of billing, 3 recent of stock.
	for i := range 33 {
		consumer, age := "stock", 40*24*time.Hour
		switch {
		case i >= 30:
			age = time.Hour
		case i >= 25:
			consumer = "billing"
		}
		pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at) VALUES ($1, $2, $3)`,
			consumer, idem.NewEventID(), now.Add(-age))
	}

	_, err := inbox.Purge(ctx, pg.Driver, inbox.PurgeConfig{Horizon: 7 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour})
	if !errors.Is(err, inbox.ErrHorizonTooShort) {
		t.Fatalf("purge with a horizon under the replay window: err = %v, want ErrHorizonTooShort", err)
	}
	if n := pg.Count(t, "processed_event"); n != 33 {
		t.Fatalf("refused purge deleted rows: %d left, want 33", n)
	}
	if _, err := inbox.Purge(ctx, pg.Driver, inbox.PurgeConfig{Horizon: 7 * 24 * time.Hour}); err == nil {
		t.Fatal("purge without a replay window: want an error")
	}

	res, err := inbox.Purge(ctx, pg.Driver, inbox.PurgeConfig{
		Consumer: "stock", Horizon: 31 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour, BatchSize: 10, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 25 || res.Batches != 3 {
		t.Errorf("result = %+v, want 25 deleted in 3 batches of at most 10", res)
	}
	if n := pg.Count(t, "processed_event WHERE consumer_name = 'stock'"); n != 3 {
		t.Errorf("stock markers left = %d, want the 3 recent ones", n)
	}
	if n := pg.Count(t, "processed_event WHERE consumer_name = 'billing'"); n != 5 {
		t.Errorf("billing markers left = %d, want 5 (not this consumer)", n)
	}
}

func TestDeliverRetriesThenParks(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, reservationDDL)
	c, err := inbox.New(pg.Driver, inbox.Config{Name: "stock", Retry: inbox.RetryPolicy{MaxRetries: 2, InitialDelay: time.Second, Jitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	fail := errors.New("database of the carrier is down")
	c.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error { return fail })
	ctx := context.Background()
	msg, err := idem.NewMessage(placed(t, "9"))
	if err != nil {
		t.Fatal(err)
	}
	msg.Headers = map[string]string{"x-trace": "abc"}
	for attempt, wantDelay := range []time.Duration{time.Second, 2 * time.Second} {
		d, err := c.Deliver(ctx, inbox.Delivery{Message: msg, Source: "stock.events", Attempt: attempt + 1})
		if err != nil || d.Action != inbox.Retry || d.RetryAfter != wantDelay || d.Attempts != attempt+1 {
			t.Fatalf("attempt %d: %+v, %v; want Retry after %v", attempt+1, d, err, wantDelay)
		}
	}
	d, err := c.Deliver(ctx, inbox.Delivery{Message: msg, Source: "stock.events", Attempt: 3})
	if err != nil || d.Action != inbox.Ack || d.Outcome != inbox.Parked {
		t.Fatalf("last attempt: %+v, %v; want parked and acked", d, err)
	}
	list, err := c.Failures().List(ctx, idem.FailedFilter{Consumer: "stock"})
	if err != nil || len(list) != 1 {
		t.Fatalf("failure store = %v, %v; want one entry", list, err)
	}
	got := list[0]
	if string(got.Body) != string(msg.Body) || got.Headers["x-trace"] != "abc" || got.Attempts != 3 ||
		got.EventID != msg.EventID || got.Source != "stock.events" || len(got.History) != 1 {
		t.Errorf("stored failure = %+v; want the raw message, its headers, 3 attempts and one history entry", got)
	}

	// Retried from the store, it fails three more times and is parked
	// again: the same entry, whose history grows.
	for range 3 {
		if _, err := c.Deliver(ctx, inbox.Delivery{Message: msg, Source: "stock.events", Attempt: 1}); err != nil {
			t.Fatal(err)
		}
	}
	again, err := c.Failures().Get(ctx, got.ID)
	if err != nil || len(again.History) != 2 {
		t.Fatalf("after a second park: %+v, %v; want 2 history entries on the same entry", again, err)
	}
	if ok, err := c.Failures().Remove(ctx, got.ID); !ok || err != nil {
		t.Fatalf("remove = %v, %v", ok, err)
	}
	if _, err := c.Failures().Get(ctx, got.ID); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("get after remove: %v, want ErrNotFound", err)
	}
}

func TestDeliverParksUndecodableAndPermanentAtOnce(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	c, err := inbox.New(pg.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		return idem.Permanent(errors.New("unknown product"))
	})
	ctx := context.Background()
	raw := []byte("not json \x00\xff")
	d, err := c.Deliver(ctx, inbox.Delivery{Message: idem.Message{Body: raw}, Source: "stock.events", Attempt: 1})
	if err != nil || d.Action != inbox.Ack || d.Outcome != inbox.Parked || !errors.Is(d.Err, idem.ErrUndecodable) {
		t.Fatalf("undecodable: %+v, %v; want parked at once", d, err)
	}
	msg, _ := idem.NewMessage(placed(t, "1"))
	d, err = c.Deliver(ctx, inbox.Delivery{Message: msg, Attempt: 1})
	if err != nil || d.Outcome != inbox.Parked {
		t.Fatalf("permanent error: %+v, %v; want parked at once", d, err)
	}
	list, err := c.Failures().List(ctx, idem.FailedFilter{})
	if err != nil || len(list) != 2 {
		t.Fatalf("failure store: %d entries, %v; want 2", len(list), err)
	}
	if string(list[1].Body) != string(raw) {
		t.Errorf("raw body = %q, want %q byte for byte", list[1].Body, raw)
	}
}

func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	p := inbox.RetryPolicy{Jitter: -1}.WithDefaults()
	if p.MaxAttempts() != 4 {
		t.Errorf("default attempts = %d, want 4 (3 retries, as Symfony Messenger)", p.MaxAttempts())
	}
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 10: time.Minute} {
		if got := p.Delay(attempt); got != want {
			t.Errorf("Delay(%d) = %v, want %v", attempt, got, want)
		}
	}
	j := inbox.RetryPolicy{}.WithDefaults()
	for range 100 {
		if d := j.Delay(1); d < 900*time.Millisecond || d > 1100*time.Millisecond {
			t.Fatalf("jittered delay %v outside 1s ±10%%", d)
		}
	}
	if (inbox.RetryPolicy{MaxRetries: -1}).Retry(1) {
		t.Error("MaxRetries -1 must not retry")
	}
}

// A Purger purges on its own, every Interval, until Stop.
func TestPurgerPurgesUntilStopped(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	ctx := context.Background()
	for range 5 {
		pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at) VALUES ('stock', $1, now() - interval '40 days')`, idem.NewEventID())
	}
	if _, err := inbox.NewPurger(pg.Driver, inbox.PurgerConfig{Markers: inbox.PurgeConfig{Horizon: time.Hour, ReplayWindow: 24 * time.Hour}}); !errors.Is(err, inbox.ErrHorizonTooShort) {
		t.Fatalf("NewPurger with a horizon under the replay window: %v, want ErrHorizonTooShort", err)
	}
	p, err := inbox.NewPurger(pg.Driver, inbox.PurgerConfig{
		Markers:  inbox.PurgeConfig{Consumer: "stock", Horizon: 31 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour},
		Interval: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 10*time.Second, "old markers purged", func() bool { return pg.Count(t, "processed_event") == 0 })
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	if err := p.Start(ctx); err == nil {
		t.Fatal("a stopped purger started again")
	}
}
