package idemtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
)

type orderPlaced struct {
	OrderID string `json:"order_id"`
	Lines   int    `json:"lines"`
}

func (p orderPlaced) Validate() error {
	if p.Lines <= 0 {
		return &idem.FieldError{Field: "lines", Problem: "must be positive"}
	}
	return nil
}

const (
	placedName    = "order.order.placed.v1"
	cancelledName = "order.order.cancelled.v1"
)

func newEvent(t testing.TB, name, orderID string, payload any) idem.Event {
	t.Helper()
	ev, err := idem.NewEvent(name, "order", orderID, payload)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// fakeTB records the failures of a helper under test instead of failing
// the test. Fatalf ends the helper's goroutine, as testing.T's does.
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.failed = true
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
	f.mu.Unlock()
	runtime.Goexit()
}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = true
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

// requireFails runs fn with a fakeTB and fails t unless fn failed with a
// message holding every one of want. It returns the message.
func requireFails(t *testing.T, fn func(tb testing.TB), want ...string) string {
	t.Helper()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.failed {
		t.Fatal("the helper did not fail")
	}
	msg := strings.Join(f.msgs, "\n")
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("the failure does not say %q:\n%s", w, msg)
		}
	}
	return msg
}

// requirePasses runs fn with a fakeTB and fails t if fn failed.
func requirePasses(t *testing.T, fn func(tb testing.TB)) {
	t.Helper()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	if f.failed {
		t.Fatalf("the helper failed: %s", strings.Join(f.msgs, "\n"))
	}
}

// place is the code under test: an order and its event in one transaction.
func place(ctx context.Context, w *outbox.Writer[*sql.Tx], tx *sql.Tx, ev idem.Event) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, ev.AggregateID); err != nil {
		return err
	}
	return w.Add(ctx, tx, ev)
}

func TestRequireAdded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := idemtest.NewSQLite(t)
	if _, err := db.DB.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	clock := idemtest.NewClockAt(time.Date(2026, 12, 4, 8, 0, 0, 123456000, time.UTC))
	w := outbox.NewWriter(db.Driver).WithClock(clock.Now)
	ev := newEvent(t, placedName, "42", orderPlaced{OrderID: "42", Lines: 2})
	ev.Headers = map[string]string{"tenant": "t-1"}
	ev.OccurredAt = time.Time{} // the writer's clock stamps it

	tx, err := db.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := place(ctx, w, tx, ev); err != nil {
		t.Fatal(err)
	}
	inTx := idemtest.OutboxTx(db.Driver, tx)
	got := idemtest.RequireAdded(t, inTx, placedName, func(p orderPlaced) bool { return p.OrderID == "42" })
	if got.Payload != (orderPlaced{OrderID: "42", Lines: 2}) || got.Event.ID != ev.ID || got.Event.AggregateID != "42" ||
		got.Event.Headers["tenant"] != "t-1" || !got.Event.OccurredAt.Equal(clock.Now()) {
		t.Errorf("RequireAdded returned %+v; want the event written (%s), its payload, headers and OccurredAt %v", got, ev.ID, clock.Now())
	}
	idemtest.RequireAdded[orderPlaced](t, inTx, placedName, nil)
	idemtest.RequireAddedPayload(t, inTx, placedName, orderPlaced{OrderID: "42", Lines: 2})
	idemtest.RequireNotAdded(t, inTx, cancelledName)

	// Other transactions see it once committed.
	committed := idemtest.OutboxOf(db.Driver)
	// SQLite has one connection: read the committed outbox after the commit.
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if evs := idemtest.AddedEvents(t, committed); len(evs) != 1 || evs[0].ID != ev.ID {
		t.Errorf("AddedEvents after the commit: %+v, want the one event", evs)
	}
}

// The Require helpers fail when they should, and say what they found.
func TestRequireAddedFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := idemtest.NewSQLite(t)
	o := idemtest.OutboxOf(db.Driver)

	requireFails(t, func(tb testing.TB) {
		idemtest.RequireAdded[orderPlaced](tb, o, placedName, nil)
	}, "no event "+placedName, "The outbox is empty")

	w := outbox.NewWriter(db.Driver)
	bad := newEvent(t, placedName, "7", map[string]any{"order_id": "7", "lines": 1, "coupon": "X"})
	good := newEvent(t, placedName, "42", orderPlaced{OrderID: "42", Lines: 2})
	cancelled := newEvent(t, cancelledName, "41", map[string]string{"order_id": "41"})
	if err := w.AddExec(ctx, db.Driver.Pool(), bad, good, cancelled); err != nil {
		t.Fatal(err)
	}

	requireFails(t, func(tb testing.TB) {
		idemtest.RequireAdded(tb, o, placedName, func(p orderPlaced) bool { return p.OrderID == "43" })
	}, "no event "+placedName, "holds 3 event(s)",
		bad.ID.String()+") "+string(bad.Payload)+": does not decode into idemtest_test.orderPlaced: field coupon", `unknown field "coupon"`,
		good.ID.String()+`) {"order_id":"42","lines":2}: does not match`, cancelledName)
	requireFails(t, func(tb testing.TB) {
		idemtest.RequireAddedPayload(tb, o, placedName, orderPlaced{OrderID: "42", Lines: 3})
	}, "no event "+placedName+" with the payload {OrderID:42 Lines:3}", "payload {OrderID:42 Lines:2}")
	requireFails(t, func(tb testing.TB) {
		idemtest.RequireNotAdded(tb, o, cancelledName)
	}, "holds 1 event(s) "+cancelledName+", want none", cancelled.ID.String())
	requireFails(t, func(tb testing.TB) {
		idemtest.RequireAdded[orderPlaced](tb, o, "order.order.shipped.v1", nil)
	}, "no event order.order.shipped.v1")

	requirePasses(t, func(tb testing.TB) {
		idemtest.RequireAdded(tb, o, placedName, func(p orderPlaced) bool { return p.OrderID == "42" })
		idemtest.RequireNotAdded(tb, o, "order.order.shipped.v1")
	})
}

// reservations is a stock consumer whose handler records a reservation, or
// fails with what fail returns.
func reservations(t *testing.T, cfg inbox.Config, fail func() error) (*idemtest.Consumer[*sql.Tx], func() int, *int) {
	t.Helper()
	db := idemtest.NewSQLite(t)
	if _, err := db.DB.Exec(`CREATE TABLE reservation (order_id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cfg.Name = "stock"
	c := idemtest.NewConsumer(t, db.Driver, cfg)
	calls := new(int)
	inbox.HandleJSON(c.Consumer, placedName, func(ctx context.Context, tx *sql.Tx, ev idem.Event, p orderPlaced) error {
		*calls++
		if fail != nil {
			if err := fail(); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO reservation VALUES (?)`, p.OrderID)
		return err
	})
	count := func() int {
		var n int
		if err := db.DB.QueryRow(`SELECT count(*) FROM reservation`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return c, count, calls
}

func TestRequireAppliedOnce(t *testing.T) {
	t.Parallel()
	c, count, _ := reservations(t, inbox.Config{}, nil)
	ev := newEvent(t, placedName, "42", orderPlaced{OrderID: "42", Lines: 2})
	c.RequireAppliedOnce(ev)
	if n := count(); n != 1 {
		t.Errorf("reservations: %d, want 1", n)
	}
	c.RequireOutcome(ev, inbox.Duplicate)
	c.RequireOutcome(newEvent(t, "order.order.shipped.v1", "42", map[string]string{}), inbox.Ignored)
	c.RequireNoneParked()

	// A second consumer's helpers fail when the outcomes are others.
	failing, _, _ := reservations(t, inbox.Config{}, func() error { return errors.New("disk full") })
	requireFails(t, func(tb testing.TB) {
		failing.WithT(tb).RequireAppliedOnce(newEvent(t, placedName, "43", orderPlaced{OrderID: "43", Lines: 1}))
	}, "delivered twice was failed (retry after", "disk full", "want applied, then duplicate")
	requireFails(t, func(tb testing.TB) {
		c.WithT(tb).RequireOutcome(ev, inbox.Applied)
	}, "was duplicate, want applied")
}

// The real failure model: a transient failure pauses without counting, a
// permanent one parks at once, an ordinary one is retried by the policy
// and then parked.
func TestFailureModel(t *testing.T) {
	t.Parallel()
	var fail error
	c, count, calls := reservations(t, inbox.Config{}, func() error { return fail })

	t.Run("transient", func(t *testing.T) {
		c := c.WithT(t)
		fail = idem.Transient(errors.New("carrier answers 503"))
		ev := newEvent(t, placedName, "1", orderPlaced{OrderID: "1", Lines: 1})
		d := c.RequireOutcome(ev, inbox.Paused)
		if d.Attempts != 0 || d.RetryAfter <= 0 {
			t.Errorf("transient failure: %+v; want a pause and no attempt counted", d)
		}
		before := *calls
		c.RequireOutcome(ev, inbox.Paused) // the clock has not moved: still paused
		if *calls != before {
			t.Errorf("the handler ran during the pause")
		}
		fail = nil
		c.Clock.Advance(d.RetryAfter)
		c.RequireOutcome(ev, inbox.Applied)
	})
	t.Run("permanent", func(t *testing.T) {
		c := c.WithT(t)
		fail = idem.Permanent(errors.New("no such product"))
		ev := newEvent(t, placedName, "2", orderPlaced{OrderID: "2", Lines: 1})
		ds := c.Settle(ev)
		if len(ds) != 1 || ds[0].Outcome != inbox.Parked {
			t.Fatalf("permanent failure: %+v; want parked at once", ds)
		}
		parked := c.RequireParked(ev)
		if parked.Attempts != 1 || !strings.Contains(parked.Error, "no such product") || parked.Source != idemtest.SourceDefault {
			t.Errorf("parked %+v", parked)
		}
	})
	t.Run("ordinary", func(t *testing.T) {
		c := c.WithT(t)
		fail = errors.New("deadlock in the handler's own logic")
		ev := newEvent(t, placedName, "3", orderPlaced{OrderID: "3", Lines: 1})
		start := c.Clock.Now()
		ds := c.Settle(ev)
		var outcomes []string
		for _, d := range ds {
			outcomes = append(outcomes, d.Outcome.String())
		}
		if got := strings.Join(outcomes, " "); got != "failed failed failed parked" {
			t.Fatalf("ordinary failure: %s; want failed three times (1s, 2s, 4s apart), then parked", got)
		}
		if waited := c.Clock.Now().Sub(start); waited < 6*time.Second || waited > 8*time.Second {
			t.Errorf("the clock moved %v, want about 7s (1s + 2s + 4s, with jitter)", waited)
		}
		if parked := c.RequireParked(ev); parked.Attempts != 4 {
			t.Errorf("parked after %d attempts, want 4", parked.Attempts)
		}
	})
	t.Run("undecodable", func(t *testing.T) {
		c := c.WithT(t)
		fail = nil
		ev := newEvent(t, placedName, "4", map[string]any{"order_id": "4", "lines": 0})
		c.RequireOutcome(ev, inbox.Parked)
		if parked := c.RequireParked(ev); !strings.Contains(parked.Error, "field lines") {
			t.Errorf("parked with %q, want the field named", parked.Error)
		}
	})
	if n := count(); n != 1 {
		t.Errorf("reservations: %d, want 1 (the transient one, applied after the pause)", n)
	}
	parked := c.Parked()
	if n := len(parked); n != 3 {
		t.Fatalf("parked: %d, want 3", n)
	}
	requireFails(t, func(tb testing.TB) {
		c.WithT(tb).RequireNoneParked()
	}, "holds 3 message(s)", "no such product", "4 attempt(s)")
	requireFails(t, func(tb testing.TB) {
		c.WithT(tb).RequireParked(newEvent(t, placedName, "5", orderPlaced{OrderID: "5", Lines: 1}))
	}, "has not parked event", "holds 3 message(s)")

	// The cause fixed, an operator re-drives the first parked message: it
	// is applied, and its entry leaves the failure store.
	fail = nil
	if d := c.Redrive(parked[0]); d.Outcome != inbox.Applied {
		t.Fatalf("re-driven: %+v, want applied", d)
	}
	if n := len(c.Parked()); n != 2 {
		t.Errorf("parked after a re-drive: %d, want 2", n)
	}
	if n := count(); n != 2 {
		t.Errorf("reservations after a re-drive: %d, want 2", n)
	}
}

// An event that keeps failing transiently pauses until the outage budget
// has passed on the clock, then is retried and parked.
func TestSettleTransientUntilTheOutageBudget(t *testing.T) {
	t.Parallel()
	c, _, _ := reservations(t, inbox.Config{OutageBudget: time.Minute, Retry: inbox.RetryPolicy{MaxRetries: 1}},
		func() error { return idem.Transient(errors.New("away")) })
	ev := newEvent(t, placedName, "1", orderPlaced{OrderID: "1", Lines: 1})
	start := c.Clock.Now()
	ds := c.Settle(ev)
	last := ds[len(ds)-1]
	if last.Outcome != inbox.Parked || last.Attempts != 2 {
		t.Fatalf("last verdict %+v; want parked after 2 attempts", last)
	}
	if ds[0].Outcome != inbox.Paused {
		t.Errorf("first verdict %+v; want paused", ds[0])
	}
	if waited := c.Clock.Now().Sub(start); waited < time.Minute {
		t.Errorf("parked after %v on the clock, before the outage budget (1m)", waited)
	}
}

// A purge on the clock: a marker older than the horizon goes, and the event
// is applied again.
func TestPurgeOnTheClock(t *testing.T) {
	t.Parallel()
	c, count, _ := reservations(t, inbox.Config{}, nil)
	ev := newEvent(t, placedName, "1", orderPlaced{OrderID: "1", Lines: 1})
	c.RequireAppliedOnce(ev)
	purge := inbox.PurgeConfig{Consumer: "stock", Horizon: 30 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour, Now: c.Clock.Now}
	res, err := inbox.Purge(context.Background(), c.Driver(), purge)
	if err != nil || res.Deleted != 0 {
		t.Fatalf("purge today: %+v, %v; want nothing deleted", res, err)
	}
	c.Clock.Advance(31 * 24 * time.Hour)
	res, err = inbox.Purge(context.Background(), c.Driver(), purge)
	if err != nil || res.Deleted != 1 {
		t.Fatalf("purge 31 days later: %+v, %v; want the marker deleted", res, err)
	}
	c.RequireOutcome(ev, inbox.Applied) // past the horizon, a copy applies again
	if n := count(); n != 2 {
		t.Errorf("reservations: %d, want 2", n)
	}
}

// The outbox helpers read every dialect's outbox, on pgx and database/sql.
func TestOutboxOnServers(t *testing.T) {
	t.Parallel()
	ev := newEvent(t, placedName, "42", orderPlaced{OrderID: "42", Lines: 2})
	ev.Headers = map[string]string{"tenant": "t-1"}
	ev.OccurredAt = time.Date(2026, 12, 4, 8, 0, 0, 123456000, time.UTC)
	check := func(t *testing.T, o idemtest.Outbox) {
		t.Helper()
		got := idemtest.RequireAddedPayload(t, o, placedName, orderPlaced{OrderID: "42", Lines: 2})
		if got.Event.ID != ev.ID || got.Event.Headers["tenant"] != "t-1" || !got.Event.OccurredAt.Equal(ev.OccurredAt) || got.Event.AggregateType != "order" {
			t.Errorf("read back %+v, want %+v", got.Event, ev)
		}
		idemtest.RequireNotAdded(t, o, cancelledName)
	}
	t.Run("postgres-pgx", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		err := pgx.BeginFunc(context.Background(), pg.Pool, func(tx pgx.Tx) error {
			if err := outbox.NewWriter(pg.Driver).Add(context.Background(), tx, ev); err != nil {
				return err
			}
			check(t, idemtest.OutboxTx(pg.Driver, tx))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		check(t, idemtest.OutboxOf(pg.Driver))
	})
	for _, tc := range []struct {
		name string
		open func(testing.TB, ...testdb.Options) *testdb.SQLDB
	}{{"mariadb", testdb.NewMariaDB}, {"sqlite", testdb.NewSQLite}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := tc.open(t)
			if err := outbox.NewWriter(db.Driver).AddExec(context.Background(), db.Driver.Pool(), ev); err != nil {
				t.Fatal(err)
			}
			check(t, idemtest.OutboxOf[*sql.Tx](db.Driver))
		})
	}
}

// The consumer kit runs on PostgreSQL too, with pgx transactions.
func TestConsumerOnPostgres(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `CREATE TABLE reservation (order_id text NOT NULL)`)
	stock := idemtest.NewConsumer(t, pg.Driver, inbox.Config{Name: "stock", Retry: inbox.RetryPolicy{MaxRetries: 1}})
	inbox.HandleJSON(stock.Consumer, placedName, func(ctx context.Context, tx pgx.Tx, ev idem.Event, p orderPlaced) error {
		if p.OrderID == "bad" {
			return errors.New("no warehouse")
		}
		_, err := tx.Exec(ctx, `INSERT INTO reservation VALUES ($1)`, p.OrderID)
		return err
	})
	stock.RequireAppliedOnce(newEvent(t, placedName, "42", orderPlaced{OrderID: "42", Lines: 1}))
	if n := pg.Count(t, "reservation"); n != 1 {
		t.Errorf("reservations: %d, want 1", n)
	}
	bad := newEvent(t, placedName, "bad", orderPlaced{OrderID: "bad", Lines: 1})
	if ds := stock.Settle(bad); len(ds) != 2 || ds[1].Outcome != inbox.Parked {
		t.Fatalf("Settle: %+v; want failed, then parked", ds)
	}
	if m := stock.RequireParked(bad); m.Attempts != 2 || !strings.Contains(m.Error, "no warehouse") {
		t.Errorf("parked %+v", m)
	}
}
