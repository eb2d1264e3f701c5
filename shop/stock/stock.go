// Package stock is the shop's stock service: its consumer, named "stock",
// reserves every line of each placed order (order.order.placed.v1), one
// reservation row per line, and releases them when the order is cancelled
// (order.order.cancelled.v1). It keeps a versioned copy of each order's
// status, so that an order placed event handled after the cancellation (a
// parked message retried late) reserves nothing.
//
// Reservations have no business key that would reject a second copy: it is
// the consumer's processed_event marker, inserted in the same transaction,
// that makes a redelivered, republished or replayed event a no-op.
package stock

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/store"
)

// ConsumerName is the stock consumer's name in processed_event.
const ConsumerName = "stock"

var migrations = store.Migrations{
	store.Postgres: {`
CREATE TABLE reservation (
    id         varchar(36)   PRIMARY KEY,
    order_id   varchar(64)   NOT NULL,
    product_id varchar(100)  NOT NULL,
    quantity   numeric(12,3) NOT NULL,
    created_at timestamptz   NOT NULL
);
CREATE INDEX reservation_order_idx ON reservation (order_id);
`, `
ALTER TABLE reservation ADD COLUMN released_at timestamptz;
CREATE TABLE order_status (
    order_id varchar(64) PRIMARY KEY,
    version  bigint      NOT NULL,
    status   varchar(20) NOT NULL
);
`},
	store.MySQL: {`
CREATE TABLE reservation (
    id         VARCHAR(36)   NOT NULL PRIMARY KEY,
    order_id   VARCHAR(64)   NOT NULL,
    product_id VARCHAR(100)  NOT NULL,
    quantity   DECIMAL(12,3) NOT NULL,
    created_at DATETIME(6)   NOT NULL,
    INDEX reservation_order_idx (order_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
`, `
ALTER TABLE reservation ADD COLUMN released_at DATETIME(6) NULL;
CREATE TABLE order_status (
    order_id VARCHAR(64) NOT NULL PRIMARY KEY,
    version  BIGINT      NOT NULL,
    status   VARCHAR(20) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
`},
	store.SQLite: {`
CREATE TABLE reservation (
    id         TEXT      NOT NULL PRIMARY KEY,
    order_id   TEXT      NOT NULL,
    product_id TEXT      NOT NULL,
    quantity   TEXT      NOT NULL,
    created_at timestamp NOT NULL
);
CREATE INDEX reservation_order_idx ON reservation (order_id);
`, `
ALTER TABLE reservation ADD COLUMN released_at timestamp;
CREATE TABLE order_status (
    order_id TEXT    NOT NULL PRIMARY KEY,
    version  INTEGER NOT NULL,
    status   TEXT    NOT NULL
);
`},
}

const (
	qRelease = `UPDATE reservation SET released_at = $1 WHERE order_id = $2 AND released_at IS NULL`
	qStatus  = `SELECT status FROM order_status WHERE order_id = $1`
)

// statusCopy is the versioned copy of each order's status.
var statusCopy = inbox.StateCopy{Table: "order_status", Key: "order_id", Version: "version", Columns: []string{"status"}}

// Migrations returns the stock service's own migrations.
func Migrations() store.Migrations { return migrations }

// Service is the stock service.
type Service struct {
	db       *store.DB
	consumer *inbox.Consumer[*sql.Tx]
}

// New returns the stock service on db, whose migrations must be applied.
func New(db *store.DB, log *slog.Logger) (*Service, error) {
	c, err := db.NewConsumer(inbox.Config{Name: ConsumerName, Logger: log})
	if err != nil {
		return nil, err
	}
	s := &Service{db: db, consumer: c}
	inbox.HandleJSON(c, shop.OrderPlaced, shop.ForOrder(s.reserve))
	inbox.HandleJSON(c, shop.OrderCancelled, shop.ForOrder(s.release))
	return s, nil
}

// Consumer returns the stock consumer.
func (s *Service) Consumer() *inbox.Consumer[*sql.Tx] { return s.consumer }

func (s *Service) reserve(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.OrderPlacedV1) error {
	copied, err := inbox.ApplyState(ctx, s.db.Driver, tx, statusCopy, p.OrderID, ev.AggregateVersion, "placed")
	if err != nil {
		return err
	}
	status := "placed" // applied: the copy holds this event's status
	if copied.Stale() {
		// A later event came first: read what it left.
		if err := tx.QueryRowContext(ctx, s.db.Q(qStatus), p.OrderID).Scan(&status); err != nil {
			return err
		}
	}
	if status == "cancelled" {
		return nil // the cancellation came first: reserve nothing
	}
	if len(p.Lines) == 0 {
		return nil
	}
	// Every line in one statement.
	now := time.Now().UTC()
	args := make([]any, 0, 5*len(p.Lines))
	for _, l := range p.Lines {
		q, _ := shop.NormalizeQuantity(l.Quantity) // checked by Decode
		args = append(args, idem.NewEventID().String(), p.OrderID, l.ProductID, q, now)
	}
	if _, err := tx.ExecContext(ctx, s.db.Q(insertReservations(len(p.Lines))), args...); err != nil {
		return fmt.Errorf("reserve the %d lines of order %s: %w", len(p.Lines), p.OrderID, err)
	}
	return nil
}

// release releases the reservations of a cancelled order. Releasing is a
// state, not a movement: a second cancellation changes nothing.
func (s *Service) release(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.OrderCancelledV1) error {
	if _, err := inbox.ApplyState(ctx, s.db.Driver, tx, statusCopy, p.OrderID, ev.AggregateVersion, "cancelled"); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.db.Q(qRelease), time.Now().UTC(), p.OrderID); err != nil {
		return fmt.Errorf("release the reservations of order %s: %w", p.OrderID, err)
	}
	return nil
}

// insertReservations is the insert of n reservations in one statement.
func insertReservations(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO reservation (id, order_id, product_id, quantity, created_at) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "($%d, $%d, $%d, $%d, $%d)", 5*i+1, 5*i+2, 5*i+3, 5*i+4, 5*i+5)
	}
	return b.String()
}
