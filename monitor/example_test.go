package monitor_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/monitor"
	"github.com/idem-go/idem/outbox"
)

// A service with an outbox and a consumer: one event waits for the relay,
// the consumer has processed two, and a message it could not decode is
// parked. A Snapshot reads it all through the service's driver.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "monitor-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "stock.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		log.Fatal(err)
	}

	// The relay has not published this one yet.
	ev, _ := idem.NewEvent("stock.item.reserved.v1", "item", "p-1", map[string]string{"order_id": "42"})
	tx, _ := drv.Begin(ctx)
	if err := outbox.NewWriter(drv).Add(ctx, tx, ev); err != nil {
		log.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		log.Fatal(err)
	}
	// The consumer processes two events and parks a body it cannot decode.
	stock, _ := inbox.New(drv, inbox.Config{Name: "stock"})
	stock.Handle(inbox.AnyEvent, func(context.Context, *sql.Tx, idem.Event) error { return nil })
	for _, id := range []string{"41", "42"} {
		placed, _ := idem.NewEvent("order.order.placed.v1", "order", id, map[string]string{"order_id": id})
		if _, err := stock.Process(ctx, placed); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := stock.Failures().Save(ctx, idem.FailedMessage{Consumer: "stock", Body: []byte("not json"), Error: "undecodable"}); err != nil {
		log.Fatal(err)
	}

	snap, err := monitor.New(drv, monitor.Options{Name: "stock"}).Snapshot(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("outbox: %d waiting, %d quarantined, published before: %v\n",
		snap.Outbox.Backlog, snap.Outbox.Quarantined, !snap.Outbox.LastPublished.IsZero())
	for _, c := range snap.Consumers {
		fmt.Printf("%s: %d processed in the last minute, %d parked\n", c.Name, c.ProcessedLastMinute, c.Parked)
	}
	// Output:
	// outbox: 1 waiting, 0 quarantined, published before: false
	// stock: 2 processed in the last minute, 1 parked
}
