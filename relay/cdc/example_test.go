package cdc_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/cdc"
)

// Publish an outbox row and an event written into the log (no row) from one
// transaction, then retire the relay's slot.
func Example() {
	ctx := context.Background()
	dbURL := os.Getenv("DATABASE_URL")
	pub := memory.New() // amqp.NewPublisher, kafka.NewPublisher, ... in production

	cfg := cdc.Config{Tables: idem.Tables{Schema: os.Getenv("OUTBOX_SCHEMA")}, MessagePrefix: "example.outbox"}
	r, err := cdc.New(dbURL, pub, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Start(ctx); err != nil { // creates the publication and the slot
		log.Fatal(err)
	}

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	drv := postgres.NewPgx(pool)
	rows := outbox.NewWriter(drv)
	wal, err := outbox.NewLogWriter(drv, "example.outbox")
	if err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	placed, _ := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]any{"total": 12})
	paid, _ := idem.NewEvent("billing.invoice.paid.v1", "invoice", "7", map[string]any{"order": "42"})
	if err := rows.Add(ctx, tx, placed); err != nil { // an outbox row
		log.Fatal(err)
	}
	if err := wal.Add(ctx, tx, paid); err != nil { // a WAL message, no row
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	if err := pub.WaitLen(ctx, 2); err != nil {
		log.Fatal(err)
	}
	for _, m := range pub.Messages() {
		ev, _ := idem.Decode(m)
		fmt.Println(ev.Name, ev.AggregateID)
	}
	if err := r.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	if err := cdc.DropSlot(ctx, dbURL, cdc.SlotName(cfg.Tables)); err != nil {
		log.Fatal(err)
	}
	_, _ = pool.Exec(ctx, "DROP PUBLICATION "+cdc.SlotName(cfg.Tables))
	// Output:
	// order.order.placed.v1 42
	// billing.invoice.paid.v1 7
}
