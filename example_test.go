package idem_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// OrderPlaced is the payload of order.order.placed.v1.
type OrderPlaced struct {
	OrderID   string `json:"order_id"`
	ProductID string `json:"product_id"`
	Quantity  int    `json:"quantity"`
}

// The whole path in one process, with no server: an order and its event
// commit together in SQLite, the relay publishes the event to the in-process
// broker, and the stock consumer applies it once, although the broker
// delivers it twice.
func Example() {
	ctx := context.Background()
	db, err := sqlite.Open(":memory:") // or a file: sqlite.Open("shop.db")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.New(drv).Up(ctx); err != nil { // outbox, processed_event, failed_message...
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY);
		CREATE TABLE reservation (order_id TEXT, product_id TEXT, quantity INTEGER)`); err != nil {
		log.Fatal(err)
	}

	// The stock service: its effects and the event's marker commit together.
	stock, err := inbox.New(drv, inbox.Config{Name: "stock"})
	if err != nil {
		log.Fatal(err)
	}
	inbox.HandleJSON(stock, "order.order.placed.v1", func(ctx context.Context, tx *sql.Tx, ev idem.Event, o OrderPlaced) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO reservation VALUES (?, ?, ?)`, o.OrderID, o.ProductID, o.Quantity)
		return err
	})

	// The broker, the stock service's subscription, and the relay.
	events := memory.New()
	sub, err := events.NewSubscriber(memory.SubscriberConfig{Consumer: "stock"}, stock.DeliverBatch)
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer sub.Stop(ctx)
	rel, err := relay.New(drv, events, relay.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := rel.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer rel.Stop(ctx)

	// The order service: the order and its event, in one transaction.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ('42')`); err != nil {
		log.Fatal(err)
	}
	ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", OrderPlaced{OrderID: "42", ProductID: "p-1", Quantity: 2})
	if err != nil {
		log.Fatal(err)
	}
	if err := outbox.NewWriter(drv).Add(ctx, tx, ev); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	rel.Notify() // publish now rather than at the next poll

	// Brokers deliver at least once: the same message comes again, as
	// after a relay's crash between publishing and marking.
	if err := events.WaitLen(ctx, 1); err != nil {
		log.Fatal(err)
	}
	if err := events.Publish(ctx, events.Messages()); err != nil {
		log.Fatal(err)
	}
	if err := events.WaitPending(ctx, "stock"); err != nil {
		log.Fatal(err)
	}

	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM reservation WHERE order_id = '42'`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	s := stock.Stats()
	fmt.Printf("applied %d, duplicates %d, reservations %d\n", s.Applied, s.Duplicates, n)
	// Output: applied 1, duplicates 1, reservations 1
}
