package inbox_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"

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

func reserve(ctx context.Context, ex driver.Executor, ev idem.Event) error {
	_, err := ex.Exec(ctx, `INSERT INTO reservation (order_id, product_id, quantity) VALUES ($1, $2, 2.000)`,
		ev.AggregateID, "p-"+ev.ID.String())
	return err
}

// reserving returns a consumer on pg whose handler runs hook (if any), then
// inserts a reservation per event.
func reserving(t *testing.T, pg *testdb.PG, name string, hook func(ctx context.Context, ex driver.Executor, ev idem.Event) error) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	c, err := inbox.New(pg.Driver, inbox.Config{Name: name})
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

func TestHandlerPanicRollsBack(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, reservationDDL)
	c := reserving(t, pg, "stock", func(ctx context.Context, ex driver.Executor, ev idem.Event) error {
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
	c := reserving(t, pg, "stock", nil)
	ev := placed(t, "1")
	ev.Name = "order.order.archived.v1"
	o, err := c.Process(context.Background(), ev)
	must(t, o, err, inbox.Ignored)
	if n := pg.Count(t, "processed_event"); n != 0 {
		t.Errorf("markers = %d, want 0", n)
	}
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
