package inbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// effectConsumer returns a consumer whose handler runs fail (when it
// returns an error, that is the handler's error) and then records the event
// in the effect table.
func effectConsumer(t *testing.T, pg *testdb.PG, cfg inbox.Config, fail func(ctx context.Context, ev idem.Event) error) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	pg.Exec(t, `CREATE TABLE IF NOT EXISTS effect (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, aggregate text NOT NULL)`)
	if cfg.Name == "" {
		cfg.Name = "stock"
	}
	c, err := inbox.New(pg.Driver, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		if fail != nil {
			if err := fail(ctx, ev); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, aggregate) VALUES ($1, $2)`, ev.ID, ev.AggregateID)
		return err
	})
	return c
}

func delivery(t *testing.T, ev idem.Event) inbox.Delivery {
	t.Helper()
	m, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	return inbox.Delivery{Message: m, Source: "stock.events", Attempt: 1}
}

func deliver(t *testing.T, c *inbox.Consumer[pgx.Tx], ds ...inbox.Delivery) []inbox.Disposition {
	t.Helper()
	disps, errs := c.DeliverBatch(context.Background(), ds)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	return disps
}

var fastPause = inbox.Config{PauseMin: 20 * time.Millisecond, PauseMax: 50 * time.Millisecond}

// A handler's transient failure pauses the consumer: no attempt is counted,
// nothing is parked, deliveries during the pause are answered without
// running the handler, and the first delivery after it succeeds.
func TestTransientFailurePausesWithoutCountingAttempts(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	var calls, failures atomic.Int32
	failures.Store(3)
	c := effectConsumer(t, pg, fastPause, func(ctx context.Context, ev idem.Event) error {
		calls.Add(1)
		if failures.Add(-1) >= 0 {
			return idem.Transient(errors.New("carrier answers 503"))
		}
		return nil
	})
	d := delivery(t, placed(t, "1"))
	for range 3 {
		got := deliver(t, c, d)[0]
		if got.Action != inbox.Pause || got.Outcome != inbox.Paused || got.RetryAfter <= 0 || got.RetryAfter > fastPause.PauseMax {
			t.Fatalf("transient failure: %+v; want Pause with a delay up to %v", got, fastPause.PauseMax)
		}
		if c.Stats().PausedSince.IsZero() {
			t.Fatal("Stats().PausedSince is zero while paused")
		}
		// During the pause, the consumer does not run the handler.
		before := calls.Load()
		if again := deliver(t, c, d)[0]; again.Action != inbox.Pause || calls.Load() != before {
			t.Fatalf("delivery during the pause: %+v, handler calls %d -> %d; want Pause without a call", again, before, calls.Load())
		}
		time.Sleep(got.RetryAfter)
	}
	if got := deliver(t, c, d)[0]; got.Action != inbox.Ack || got.Outcome != inbox.Applied {
		t.Fatalf("after the dependency's return: %+v; want applied", got)
	}
	if !c.Stats().PausedSince.IsZero() {
		t.Error("still paused after a success")
	}
	for _, table := range []string{"failed_message", "delivery_attempt"} {
		if n := pg.Count(t, table); n != 0 {
			t.Errorf("%s rows: %d, want 0: a transient failure costs no attempt", table, n)
		}
	}
}

// An event that keeps failing transiently beyond the outage budget has its
// failures counted, and is parked when the retry policy runs out.
func TestTransientFailuresCountAfterTheOutageBudget(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	cfg := fastPause
	cfg.OutageBudget = 100 * time.Millisecond
	cfg.Retry = inbox.RetryPolicy{MaxRetries: 1, InitialDelay: time.Millisecond, Jitter: -1}
	c := effectConsumer(t, pg, cfg, func(ctx context.Context, ev idem.Event) error {
		return idem.Transient(errors.New("always away"))
	})
	d := delivery(t, placed(t, "1"))
	deadline := time.Now().Add(10 * time.Second)
	var got inbox.Disposition
	for got.Outcome != inbox.Parked {
		if time.Now().After(deadline) {
			t.Fatalf("not parked after 10s; last disposition %+v", got)
		}
		got = deliver(t, c, d)[0]
		time.Sleep(got.RetryAfter)
	}
	if got.Attempts != 2 {
		t.Errorf("parked after %d attempts, want 2 (MaxRetries 1)", got.Attempts)
	}
}

// While the consumer's own database is unreachable, deliveries pause
// (decodable or not): nothing can be parked, nothing is lost.
func TestDatabaseDownPauses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://idem@127.0.0.1:1/nowhere?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := inbox.New(postgres.NewPgx(pool), inbox.Config{Name: "stock", PauseMin: time.Millisecond, PauseMax: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(context.Context, pgx.Tx, idem.Event) error { return nil })
	good := delivery(t, placed(t, "1"))
	bad := inbox.Delivery{Message: idem.Message{Body: []byte("not json")}, Source: "stock.events"}
	for _, d := range []inbox.Delivery{good, bad} {
		time.Sleep(10 * time.Millisecond) // past any pause
		got, err := c.Deliver(ctx, d)
		if err != nil || got.Action != inbox.Pause {
			t.Fatalf("database down: %+v, %v; want Pause and no error", got, err)
		}
	}
}

// Within one delivery, once an event of an aggregate waits for a retry, the
// later events of that aggregate are not attempted; other aggregates go on.
func TestLaterEventsOfAnAggregateWaitBehindARetry(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	a1, a2, a3, b1 := placed(t, "A"), placed(t, "A"), placed(t, "A"), placed(t, "B")
	var failA1 atomic.Bool
	failA1.Store(true)
	c := effectConsumer(t, pg, inbox.Config{}, func(ctx context.Context, ev idem.Event) error {
		if ev.ID == a1.ID && failA1.Load() {
			return errors.New("stock service busy")
		}
		return nil
	})
	got := deliver(t, c, delivery(t, a1), delivery(t, b1), delivery(t, a2), delivery(t, a3))
	if got[0].Action != inbox.Retry || got[0].Outcome != inbox.Failed {
		t.Errorf("failing event: %+v, want Retry", got[0])
	}
	if got[1].Outcome != inbox.Applied {
		t.Errorf("other aggregate: %+v, want applied", got[1])
	}
	for _, d := range got[2:] {
		if d.Action != inbox.Retry || d.Outcome != inbox.Deferred || d.RetryAfter != got[0].RetryAfter {
			t.Errorf("later event of the failing aggregate: %+v, want deferred with the same delay", d)
		}
	}
	failA1.Store(false)
	for _, d := range deliver(t, c, delivery(t, a1), delivery(t, a2), delivery(t, a3)) {
		if d.Outcome != inbox.Applied {
			t.Fatalf("after the retry: %+v, want applied", d)
		}
	}
	rows, err := pg.Pool.Query(context.Background(), `SELECT event_id::text FROM effect WHERE aggregate = 'A' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 || ids[0] != a1.ID.String() || ids[1] != a2.ID.String() || ids[2] != a3.ID.String() {
		t.Errorf("aggregate A applied as %v; want %s, %s, %s", ids, a1.ID, a2.ID, a3.ID)
	}
}

// A handler that outlives the delivery timeout is cancelled; the failure is
// transient (a dependency that hangs): no attempt is counted.
func TestDeliveryTimeout(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	cfg := fastPause
	cfg.DeliveryTimeout = 100 * time.Millisecond
	c := effectConsumer(t, pg, cfg, func(ctx context.Context, ev idem.Event) error {
		<-ctx.Done()
		return ctx.Err()
	})
	start := time.Now()
	got := deliver(t, c, delivery(t, placed(t, "1")))[0]
	if got.Action != inbox.Pause || time.Since(start) > 5*time.Second {
		t.Fatalf("hanging handler: %+v after %v; want Pause soon after the 100ms timeout", got, time.Since(start))
	}
	if n := pg.Count(t, "delivery_attempt"); n != 0 {
		t.Errorf("delivery_attempt rows: %d, want 0", n)
	}
}

// Config.Now is the consumer's clock: a pause ends, and the outage budget
// runs out, when it says so, whatever the wall clock says.
func TestClockDrivesPausesAndOutageBudget(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	var mu sync.Mutex
	now := time.Date(2026, 12, 4, 8, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	var calls atomic.Int32
	c := effectConsumer(t, pg, inbox.Config{Now: clock, OutageBudget: time.Minute, PauseMin: time.Hour, PauseMax: time.Hour},
		func(ctx context.Context, ev idem.Event) error {
			calls.Add(1)
			return idem.Transient(errors.New("carrier answers 503"))
		})
	d := delivery(t, placed(t, "42"))

	got := deliver(t, c, d)[0]
	if got.Action != inbox.Pause || got.RetryAfter < 30*time.Minute || got.RetryAfter > time.Hour {
		t.Fatalf("transient failure: %+v; want Pause for 30m to 1h by the consumer's clock", got)
	}
	if again := deliver(t, c, d)[0]; again.Action != inbox.Pause || calls.Load() != 1 {
		t.Fatalf("delivery while the clock stands still: %+v, handler calls %d; want Pause without a call", again, calls.Load())
	}
	advance(2 * time.Hour) // past the pause (at most 1h) and the outage budget (1m)
	got = deliver(t, c, d)[0]
	if calls.Load() != 2 || got.Action != inbox.Retry || got.Attempts != 1 {
		t.Fatalf("after the clock passed the pause and the outage budget: %+v, handler calls %d; want the handler run and one attempt counted (Retry)", got, calls.Load())
	}
}
