package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/outbox"
)

// Write an order and its event in one transaction: the event exists if and
// only if the order committed.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	writer := outbox.NewWriter(postgres.NewPgx(pool))

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, status) VALUES ('42', 'confirmed')`); err != nil {
		log.Fatal(err)
	}
	ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]any{
		"orderId": "42", "customerId": "c-7",
		"lines": []map[string]string{{"productId": "p-1", "quantity": "2.000"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := writer.Add(ctx, tx, ev); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	var name, aggregate string
	if err := pool.QueryRow(ctx, `SELECT type, aggregateid FROM outbox WHERE id = $1`, ev.ID).Scan(&name, &aggregate); err != nil {
		log.Fatal(err)
	}
	fmt.Println(name, aggregate)
	// Output: order.order.placed.v1 42
}
