package idemtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/outbox"
)

// OrderPlaced is the payload of order.order.placed.v1.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
	Lines   int    `json:"lines"`
}

// PlaceOrder is application code: the order and its event, in the
// caller's transaction.
func PlaceOrder(ctx context.Context, w *outbox.Writer[*sql.Tx], tx *sql.Tx, id string, lines int) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, id); err != nil {
		return err
	}
	ev, err := idem.NewEvent("order.order.placed.v1", "order", id, OrderPlaced{OrderID: id, Lines: lines})
	if err != nil {
		return err
	}
	return w.Add(ctx, tx, ev)
}

// What a transaction wrote to the outbox, before it commits.
func ExampleRequireAdded() {
	t := exampleT() // in a test: the test's *testing.T
	defer t.cleanup()
	ctx := context.Background()

	db := idemtest.NewSQLite(t)
	if _, err := db.DB.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatalf("%v", err)
	}
	tx, err := db.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer tx.Rollback()
	if err := PlaceOrder(ctx, outbox.NewWriter(db.Driver), tx, "42", 2); err != nil {
		t.Fatalf("%v", err)
	}

	out := idemtest.OutboxTx(db.Driver, tx)
	placed := idemtest.RequireAdded(t, out, "order.order.placed.v1", func(p OrderPlaced) bool { return p.OrderID == "42" })
	idemtest.RequireNotAdded(t, out, "order.order.cancelled.v1")
	fmt.Println(placed.Event.AggregateID, placed.Payload.Lines)
	// Output: 42 2
}

// A handler through the real inbox: delivered twice, applied once.
func ExampleConsumer_RequireAppliedOnce() {
	t := exampleT()
	defer t.cleanup()
	db := idemtest.NewSQLite(t)
	if _, err := db.DB.Exec(`CREATE TABLE reservation (order_id TEXT NOT NULL)`); err != nil {
		t.Fatalf("%v", err)
	}

	stock := idemtest.NewConsumer(t, db.Driver, inbox.Config{Name: "stock"})
	inbox.HandleJSON(stock.Consumer, "order.order.placed.v1", func(ctx context.Context, tx *sql.Tx, ev idem.Event, p OrderPlaced) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO reservation VALUES (?)`, p.OrderID)
		return err
	})

	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", OrderPlaced{OrderID: "42", Lines: 2})
	stock.RequireAppliedOnce(ev) // applied, then duplicate

	var n int
	_ = db.DB.QueryRow(`SELECT count(*) FROM reservation`).Scan(&n)
	fmt.Println("reservations:", n)
	// Output: reservations: 1
}

// The failure model, on the consumer's clock: an ordinary error is retried
// by the retry policy (1s, 2s, 4s), then parked; Settle moves the clock by
// each delay instead of waiting.
func ExampleConsumer_Settle() {
	t := exampleT()
	defer t.cleanup()
	db := idemtest.NewSQLite(t)

	stock := idemtest.NewConsumer(t, db.Driver, inbox.Config{Name: "stock"})
	stock.Handle("order.order.placed.v1", func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
		return errors.New("no warehouse for this product")
	})

	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", OrderPlaced{OrderID: "42", Lines: 2})
	var outcomes []string
	for _, d := range stock.Settle(ev) {
		outcomes = append(outcomes, d.Outcome.String())
	}
	fmt.Println(strings.Join(outcomes, ", "))
	parked := stock.RequireParked(ev)
	_, cause, _ := strings.Cut(parked.Error, ev.ID.String()+": ") // after "idem: handling <name> <id>: "
	fmt.Println(parked.Attempts, "attempts:", cause)
	// Output:
	// failed, failed, failed, parked
	// 4 attempts: no warehouse for this product
}

// A transient failure (a dependency away) pauses the consumer without
// counting an attempt; the pause ends when the clock has passed it.
func ExampleConsumer_Deliver() {
	t := exampleT()
	defer t.cleanup()
	db := idemtest.NewSQLite(t)

	carrierUp := false
	shipping := idemtest.NewConsumer(t, db.Driver, inbox.Config{Name: "shipping"})
	shipping.Handle("order.order.placed.v1", func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
		if !carrierUp {
			return idem.Transient(errors.New("carrier answers 503"))
		}
		return nil
	})

	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", OrderPlaced{OrderID: "42", Lines: 2})
	d := shipping.Deliver(ev)
	fmt.Println(d.Outcome, d.Attempts)
	carrierUp = true
	fmt.Println(shipping.Deliver(ev).Outcome) // the clock has not moved: still paused
	shipping.Clock.Advance(d.RetryAfter)
	fmt.Println(shipping.Deliver(ev).Outcome)
	// Output:
	// paused 0
	// paused
	// applied
}

// exampleTB stands for a test's *testing.T in the examples: a failure
// panics, cleanups run at cleanup.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func exampleT() *exampleTB { return &exampleTB{} }

func (t *exampleTB) Helper()                           {}
func (t *exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *exampleTB) Logf(string, ...any)               {}
func (t *exampleTB) Output() io.Writer                 { return io.Discard }
func (t *exampleTB) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }

func (t *exampleTB) TempDir() string {
	dir, err := os.MkdirTemp("", "idemtest-example")
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (t *exampleTB) cleanup() {
	for _, f := range slices.Backward(t.cleanups) {
		f()
	}
}
