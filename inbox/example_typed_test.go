package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/migrate"
)

// OrderPlaced is the payload of order.order.placed.v1.
type OrderPlaced struct {
	OrderID  string `json:"orderId"`
	Quantity int    `json:"quantity"`
}

// Validate is run by HandleJSON after decoding.
func (o OrderPlaced) Validate() error {
	if o.Quantity <= 0 {
		return &idem.FieldError{Field: "quantity", Problem: fmt.Sprintf("%d is not positive", o.Quantity)}
	}
	return nil
}

// HandleJSON gives the handler the payload as a Go value: decoded strictly
// and validated, or parked at once when it cannot be (no retry can fix a
// payload).
func ExampleHandleJSON() {
	dir, _ := os.MkdirTemp("", "idem-example-")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "stock.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv := sqlite.New(db)
	ctx := context.Background()
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		log.Fatal(err)
	}
	stock, err := inbox.New(drv, inbox.Config{Name: "stock"})
	if err != nil {
		log.Fatal(err)
	}
	inbox.HandleJSON(stock, "order.order.placed.v1", func(ctx context.Context, tx *sql.Tx, ev idem.Event, o OrderPlaced) error {
		fmt.Println("reserving", o.Quantity, "for order", o.OrderID)
		return nil
	})

	good, _ := idem.NewEvent("order.order.placed.v1", "order", "42", OrderPlaced{OrderID: "42", Quantity: 2})
	bad, _ := idem.NewEvent("order.order.placed.v1", "order", "43", map[string]any{"orderId": "43", "quantity": 0})
	for _, ev := range []idem.Event{good, bad} {
		msg, _ := idem.NewMessage(ev)
		// What a subscriber does with each message it receives.
		d, err := stock.Deliver(ctx, inbox.Delivery{Message: msg, Source: "stock.events", Attempt: 1})
		if err != nil {
			log.Fatal(err)
		}
		var pe *inbox.PayloadError
		if errors.As(d.Err, &pe) {
			fmt.Println(d.Outcome, "at field", pe.Field)
			continue
		}
		fmt.Println(d.Outcome)
	}
	// Output:
	// reserving 2 for order 42
	// applied
	// parked at field quantity
}
