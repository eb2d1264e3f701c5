package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

func TestMain(m *testing.M) {
	os.Exit(testdb.RunWithExampleDatabase(m,
		// database/sql's connection opener outlives a test until DB.Close.
		func() error { return goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener")) },
		`CREATE TABLE reservation (order_id text NOT NULL, product_id text NOT NULL, quantity numeric NOT NULL)`))
}

const reservationDDL = `CREATE TABLE reservation (
    id         bigserial PRIMARY KEY,
    order_id   text    NOT NULL,
    product_id text    NOT NULL,
    quantity   numeric NOT NULL,
    CONSTRAINT reservation_order_product UNIQUE (order_id, product_id)
)`

// flavours runs fn once with the pgx driver and once with database/sql, so
// both transaction types are covered by every behaviour test.
func flavours(t *testing.T, fn func(t *testing.T, pg *testdb.PG, h harness)) {
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		pg.Exec(t, reservationDDL)
		fn(t, pg, pgxHarness{pg.Driver})
	})
	t.Run("database_sql", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		pg.Exec(t, reservationDDL)
		fn(t, pg, sqlHarness{postgres.NewSQL(pg.DB)})
	})
}

// harness builds consumers of one transaction type whose handler inserts a
// reservation per event, optionally going through hook first.
type harness interface {
	consumer(t *testing.T, name string, hook func(ctx context.Context, ex driver.Executor, ev idem.Event) error) consumer
}

// consumer is the transaction-type-free view of inbox.Consumer the tests use.
type consumer interface {
	Process(ctx context.Context, ev idem.Event) (inbox.Outcome, error)
	ProcessBatch(ctx context.Context, evs []idem.Event) []inbox.Result
}

func reserve(ctx context.Context, ex driver.Executor, ev idem.Event) error {
	_, err := ex.Exec(ctx, `INSERT INTO reservation (order_id, product_id, quantity) VALUES ($1, $2, 2.000)`,
		ev.AggregateID, "p-"+ev.ID.String())
	return err
}

type pgxHarness struct{ drv *postgres.PgxDriver }

func (h pgxHarness) consumer(t *testing.T, name string, hook func(context.Context, driver.Executor, idem.Event) error) consumer {
	c, err := inbox.New(h.drv, inbox.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		ex := postgres.PgxExecutor{Q: tx}
		if hook != nil {
			if err := hook(ctx, ex, ev); err != nil {
				return err
			}
		}
		return reserve(ctx, ex, ev)
	})
	return c
}

type sqlHarness struct{ drv *driver.SQLDriver }

func (h sqlHarness) consumer(t *testing.T, name string, hook func(context.Context, driver.Executor, idem.Event) error) consumer {
	c, err := inbox.New(h.drv, inbox.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle("order.order.placed.v1", func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
		ex := driver.SQLExecutor{Q: tx}
		if hook != nil {
			if err := hook(ctx, ex, ev); err != nil {
				return err
			}
		}
		return reserve(ctx, ex, ev)
	})
	return c
}

func placed(t testing.TB, orderID string) idem.Event {
	t.Helper()
	ev, err := idem.NewEvent("order.order.placed.v1", "order", orderID, map[string]any{
		"orderId": orderID, "customerId": "c-1",
		"lines": []map[string]string{{"productId": "p-1", "quantity": "2.000"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func must(t *testing.T, o inbox.Outcome, err error, want inbox.Outcome) {
	t.Helper()
	if err != nil || o != want {
		t.Fatalf("outcome = %v, %v; want %v, nil", o, err, want)
	}
}

func TestSameEventDeliveredTwiceReservesStockOnce(t *testing.T) {
	t.Parallel()
	flavours(t, func(t *testing.T, pg *testdb.PG, h harness) {
		ctx := context.Background()
		c := h.consumer(t, "stock", nil)
		ev := placed(t, "42")

		o, err := c.Process(ctx, ev)
		must(t, o, err, inbox.Applied)
		o, err = c.Process(ctx, ev)
		must(t, o, err, inbox.Duplicate)

		if n := pg.Count(t, "reservation WHERE order_id = '42'"); n != 1 {
			t.Errorf("reservations = %d, want 1", n)
		}
		if n := pg.Count(t, "processed_event WHERE consumer_name = 'stock' AND event_id = $1", ev.ID); n != 1 {
			t.Errorf("processed_event rows = %d, want 1", n)
		}
	})
}

func TestFailingHandlerLeavesNoEffectAndNoMarker(t *testing.T) {
	t.Parallel()
	flavours(t, func(t *testing.T, pg *testdb.PG, h harness) {
		ctx := context.Background()
		var fail atomic.Bool
		fail.Store(true)
		boom := errors.New("carrier unavailable")
		c := h.consumer(t, "stock", func(ctx context.Context, ex driver.Executor, ev idem.Event) error {
			// The effect is written first, then the handler fails: both must
			// roll back.
			if err := reserve(ctx, ex, ev); err != nil {
				return err
			}
			if fail.Load() {
				return boom
			}
			_, err := ex.Exec(ctx, `DELETE FROM reservation WHERE product_id = $1`, "p-"+ev.ID.String())
			return err
		})
		ev := placed(t, "7")

		o, err := c.Process(ctx, ev)
		var he *inbox.HandlerError
		if o != inbox.Failed || !errors.As(err, &he) || !errors.Is(err, boom) {
			t.Fatalf("outcome = %v, %v; want Failed with the handler error", o, err)
		}
		if n := pg.Count(t, "reservation"); n != 0 {
			t.Errorf("reservations after failure = %d, want 0", n)
		}
		if n := pg.Count(t, "processed_event"); n != 0 {
			t.Errorf("processed_event rows after failure = %d, want 0", n)
		}

		fail.Store(false)
		o, err = c.Process(ctx, ev)
		must(t, o, err, inbox.Applied)
		if n := pg.Count(t, "reservation WHERE order_id = '7'"); n != 1 {
			t.Errorf("reservations after retry = %d, want 1", n)
		}
	})
}

func TestHandlerPanicRollsBack(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, reservationDDL)
	c := pgxHarness{pg.Driver}.consumer(t, "stock", func(ctx context.Context, ex driver.Executor, ev idem.Event) error {
		_ = reserve(ctx, ex, ev)
		panic("nil map")
	})
	o, err := c.Process(context.Background(), placed(t, "1"))
	if o != inbox.Failed || err == nil {
		t.Fatalf("outcome = %v, %v; want Failed", o, err)
	}
	if n := pg.Count(t, "reservation") + pg.Count(t, "processed_event"); n != 0 {
		t.Errorf("rows after panic = %d, want 0", n)
	}
}

// TestConcurrentDeliveries holds the first worker inside its handler until the
// second is seen waiting on the marker insert (pg_blocking_pids), then lets
// the first commit or roll back.
func TestConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	for _, firstCommits := range []bool{true, false} {
		t.Run(fmt.Sprintf("first_commits=%v", firstCommits), func(t *testing.T) {
			t.Parallel()
			flavours(t, func(t *testing.T, pg *testdb.PG, h harness) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				entered := make(chan int32, 1) // backend pid of the first worker
				release := make(chan struct{})
				var calls atomic.Int32
				c := h.consumer(t, "stock", func(ctx context.Context, ex driver.Executor, ev idem.Event) error {
					if calls.Add(1) > 1 {
						return nil
					}
					var pid int32
					if err := driver.QueryRow(ctx, ex, "SELECT pg_backend_pid()", nil, &pid); err != nil {
						return err
					}
					entered <- pid
					<-release
					if !firstCommits {
						return errors.New("first worker fails")
					}
					return nil
				})
				ev := placed(t, "42")

				type res struct {
					o   inbox.Outcome
					err error
				}
				first, second := make(chan res, 1), make(chan res, 1)
				go func() { o, err := c.Process(ctx, ev); first <- res{o, err} }()
				pid := <-entered
				go func() { o, err := c.Process(ctx, ev); second <- res{o, err} }()

				// Wait until the second worker's marker insert is blocked by
				// the first worker's transaction.
				deadline := time.Now().Add(20 * time.Second)
				for {
					var waiting int
					if err := pg.Pool.QueryRow(ctx,
						`SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&waiting); err != nil {
						t.Fatal(err)
					}
					if waiting > 0 {
						break
					}
					select {
					case r := <-second:
						t.Fatalf("second worker finished (%v, %v) while the first still held the event", r.o, r.err)
					default:
					}
					if time.Now().After(deadline) {
						t.Fatal("second worker never waited on the first one's marker")
					}
					time.Sleep(5 * time.Millisecond)
				}
				close(release)
				r1, r2 := <-first, <-second
				if firstCommits {
					must(t, r1.o, r1.err, inbox.Applied)
					must(t, r2.o, r2.err, inbox.Duplicate)
				} else {
					if r1.o != inbox.Failed {
						t.Fatalf("first = %v, %v; want Failed", r1.o, r1.err)
					}
					must(t, r2.o, r2.err, inbox.Applied)
				}
				if n := pg.Count(t, "reservation WHERE order_id = '42'"); n != 1 {
					t.Errorf("reservations = %d, want exactly 1", n)
				}
				if n := pg.Count(t, "processed_event"); n != 1 {
					t.Errorf("processed_event rows = %d, want 1", n)
				}
			})
		})
	}
}

func TestTwoConsumerNamesEachApplyOnce(t *testing.T) {
	t.Parallel()
	flavours(t, func(t *testing.T, pg *testdb.PG, h harness) {
		ctx := context.Background()
		pg.Exec(t, `ALTER TABLE reservation DROP CONSTRAINT reservation_order_product`)
		stock := h.consumer(t, "stock", nil)
		shipping := h.consumer(t, "shipping-preparation-v1", nil)
		ev := placed(t, "42")
		for range 2 {
			if _, err := stock.Process(ctx, ev); err != nil {
				t.Fatal(err)
			}
			if _, err := shipping.Process(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
		if n := pg.Count(t, "reservation"); n != 2 {
			t.Errorf("effects = %d, want one per consumer (2)", n)
		}
		for _, name := range []string{"stock", "shipping-preparation-v1"} {
			if n := pg.Count(t, "processed_event WHERE consumer_name = $1", name); n != 1 {
				t.Errorf("markers of %s = %d, want 1", name, n)
			}
		}
	})
}

func TestUnrelatedConstraintViolationIsAnError(t *testing.T) {
	t.Parallel()
	flavours(t, func(t *testing.T, pg *testdb.PG, h harness) {
		ctx := context.Background()
		ev := placed(t, "42")
		// Another event already reserved this (order, product) pair.
		pg.Exec(t, `INSERT INTO reservation (order_id, product_id, quantity) VALUES ('42', $1, 1)`, "p-"+ev.ID.String())
		c := h.consumer(t, "stock", nil)
		o, err := c.Process(ctx, ev)
		if o != inbox.Failed || !postgres.IsUniqueViolation(err, "reservation_order_product") {
			t.Fatalf("outcome = %v, %v; want Failed with the reservation unique violation", o, err)
		}
		if n := pg.Count(t, "processed_event"); n != 0 {
			t.Errorf("processed_event rows = %d, want 0: the event is not a duplicate", n)
		}
	})
}

func TestSeveralHandlersShareOneMarker(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, reservationDDL)
	pg.Exec(t, `CREATE TABLE notice (event_id uuid PRIMARY KEY)`)
	c, err := inbox.New(pg.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	var failSecond atomic.Bool
	c.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		return reserve(ctx, postgres.PgxExecutor{Q: tx}, ev)
	})
	c.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		if failSecond.Load() {
			return errors.New("second handler fails")
		}
		_, err := tx.Exec(ctx, `INSERT INTO notice VALUES ($1)`, ev.ID)
		return err
	})
	ctx := context.Background()
	ev := placed(t, "42")
	failSecond.Store(true)
	if o, _ := c.Process(ctx, ev); o != inbox.Failed {
		t.Fatalf("outcome = %v, want Failed", o)
	}
	if n := pg.Count(t, "reservation"); n != 0 {
		t.Fatalf("first handler's effect survived the second's failure: %d rows", n)
	}
	failSecond.Store(false)
	o, err := c.Process(ctx, ev)
	must(t, o, err, inbox.Applied)
	o, err = c.Process(ctx, ev)
	must(t, o, err, inbox.Duplicate)
	if pg.Count(t, "reservation") != 1 || pg.Count(t, "notice") != 1 || pg.Count(t, "processed_event") != 1 {
		t.Fatal("want one effect per handler and one marker")
	}
}

func TestEventWithoutHandlerIsIgnored(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, reservationDDL)
	c := pgxHarness{pg.Driver}.consumer(t, "stock", nil)
	ev := placed(t, "1")
	ev.Name = "order.order.archived.v1"
	o, err := c.Process(context.Background(), ev)
	must(t, o, err, inbox.Ignored)
	if n := pg.Count(t, "processed_event"); n != 0 {
		t.Errorf("markers = %d, want 0", n)
	}
}

func TestBatch(t *testing.T) {
	t.Parallel()
	flavours(t, func(t *testing.T, pg *testdb.PG, h harness) {
		ctx := context.Background()
		var bad atomic.Value
		bad.Store("")
		c := h.consumer(t, "stock", func(ctx context.Context, ex driver.Executor, ev idem.Event) error {
			if ev.AggregateID == bad.Load().(string) {
				return errors.New("bad event")
			}
			return nil
		})
		evs := make([]idem.Event, 10)
		for i := range evs {
			evs[i] = placed(t, fmt.Sprint(i))
		}
		// A duplicate already applied, and one repeated inside the batch.
		o, err := c.Process(ctx, evs[0])
		must(t, o, err, inbox.Applied)
		batch := append(append([]idem.Event{}, evs...), evs[3])
		bad.Store("5")
		res := c.ProcessBatch(ctx, batch)
		for i, r := range res {
			want := inbox.Applied
			switch i {
			case 0, 10:
				want = inbox.Duplicate
			case 5:
				want = inbox.Failed
			}
			if r.Outcome != want {
				t.Errorf("result %d = %v (%v), want %v", i, r.Outcome, r.Err, want)
			}
		}
		if n := pg.Count(t, "reservation"); n != 9 {
			t.Errorf("reservations = %d, want 9 (all but the failing one)", n)
		}
		if n := pg.Count(t, "processed_event"); n != 9 {
			t.Errorf("markers = %d, want 9", n)
		}
		bad.Store("")
		res = c.ProcessBatch(ctx, evs)
		for i, r := range res {
			want := inbox.Duplicate
			if i == 5 {
				want = inbox.Applied
			}
			if r.Outcome != want || r.Err != nil {
				t.Errorf("second batch result %d = %v (%v), want %v", i, r.Outcome, r.Err, want)
			}
		}
	})
}

func TestConsumerConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	drv := postgres.NewSQL(nil)
	for _, tc := range []struct {
		cfg  inbox.Config
		want string
	}{
		{inbox.Config{}, "Config.Name is required"},
		{inbox.Config{Name: "bad name"}, "Config.Name"},
		{inbox.Config{Name: "stock", Retry: inbox.RetryPolicy{Multiplier: 0.5}}, "RetryPolicy.Multiplier"},
	} {
		_, err := inbox.New(drv, tc.cfg)
		if err == nil || !contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error mentioning %q", tc.cfg, err, tc.want)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestMissingTableSaysToMigrate(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: true})
	c, err := inbox.New(pg.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(context.Context, pgx.Tx, idem.Event) error { return nil })
	_, err = c.Process(context.Background(), placed(t, "1"))
	if !errors.Is(err, idem.ErrMissingTable) || !contains(err.Error(), "idem migrate up") {
		t.Fatalf("err = %v; want ErrMissingTable telling to run idem migrate up", err)
	}
}
