// Package shipping is the shop's shipping service, the second article's
// consumer. It runs two consumers:
//
//   - "shipping-preparation-v1" handles order.order.placed.v1 and
//     order.order.cancelled.v1. It keeps a copy of each order's status with a
//     versioned upsert (a late, older event never overwrites a newer
//     status), creates one preparation per order (a unique constraint on
//     order_id makes two different events asking for the same preparation
//     still make one), and cancels it. Whatever the arrival order of
//     OrderPlaced and OrderCancelled, a cancelled order has no active
//     preparation. Its events (shipping.preparation.created.v1,
//     shipping.preparation.cancelled.v1) go through its own outbox, in the
//     same transaction as its effects.
//   - "shipping-carrier-v1" handles shipping.preparation.created.v1: it asks
//     the carrier for a pickup with the stable idempotency key
//     shipment:<order id>:initial, looks the pickup up by reference when the
//     answer is lost, then records the shipment and publishes
//     shipping.shipment.requested.v1 in one transaction. It also handles
//     shipping.preparation.cancelled.v1: a cancel can come after the pickup
//     was requested (the order service learns of the shipment only through
//     events), so it cancels the pickup at the carrier with its own stable
//     key shipment:<order id>:cancel, records it and publishes
//     shipping.shipment.cancelled.v1.
//
// The pickup request holds the preparation's row lock while it calls the
// carrier, and the cancellation takes the same lock: either the
// cancellation comes first and no pickup is requested, or it waits, sees
// the shipment, and the pickup is cancelled.
package shipping

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/carrier"
	"github.com/idem-go/idem/shop/store"
)

// Consumer names.
const (
	PreparationConsumer = "shipping-preparation-v1"
	CarrierConsumer     = "shipping-carrier-v1"
)

// Preparation statuses.
const (
	PreparationActive    = "active"
	PreparationCancelled = "cancelled"
)

var migrations = store.Migrations{
	store.Postgres: {`
CREATE TABLE order_status (
    order_id varchar(64) PRIMARY KEY,
    version  bigint      NOT NULL,
    status   varchar(20) NOT NULL
);
CREATE TABLE preparation (
    id         varchar(36) PRIMARY KEY,
    order_id   varchar(64) NOT NULL,
    status     varchar(20) NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT preparation_order_key UNIQUE (order_id)
);
CREATE TABLE shipment (
    order_id        varchar(64)  PRIMARY KEY,
    pickup_id       varchar(36)  NOT NULL,
    idempotency_key varchar(255) NOT NULL,
    created_at      timestamptz  NOT NULL
);
`, `
ALTER TABLE shipment ADD COLUMN cancelled_at timestamptz;
`},
	store.MySQL: {`
CREATE TABLE order_status (
    order_id VARCHAR(64) NOT NULL PRIMARY KEY,
    version  BIGINT      NOT NULL,
    status   VARCHAR(20) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE preparation (
    id         VARCHAR(36) NOT NULL PRIMARY KEY,
    order_id   VARCHAR(64) NOT NULL,
    status     VARCHAR(20) NOT NULL,
    created_at DATETIME(6) NOT NULL,
    updated_at DATETIME(6) NOT NULL,
    CONSTRAINT preparation_order_key UNIQUE (order_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE shipment (
    order_id        VARCHAR(64)  NOT NULL PRIMARY KEY,
    pickup_id       VARCHAR(36)  NOT NULL,
    idempotency_key VARCHAR(255) NOT NULL,
    created_at      DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
`, `
ALTER TABLE shipment ADD COLUMN cancelled_at DATETIME(6) NULL;
`},
	store.SQLite: {`
CREATE TABLE order_status (
    order_id TEXT    NOT NULL PRIMARY KEY,
    version  INTEGER NOT NULL,
    status   TEXT    NOT NULL
);
CREATE TABLE preparation (
    id         TEXT      NOT NULL PRIMARY KEY,
    order_id   TEXT      NOT NULL,
    status     TEXT      NOT NULL,
    created_at timestamp NOT NULL,
    updated_at timestamp NOT NULL,
    CONSTRAINT preparation_order_key UNIQUE (order_id)
);
CREATE TABLE shipment (
    order_id        TEXT      NOT NULL PRIMARY KEY,
    pickup_id       TEXT      NOT NULL,
    idempotency_key TEXT      NOT NULL,
    created_at      timestamp NOT NULL
);
`, `
ALTER TABLE shipment ADD COLUMN cancelled_at timestamp;
`},
}

// Statements per dialect (store.DB.Pick): an order's preparation, unless it
// has one (MySQL/MariaDB has no ON CONFLICT, and its ON DUPLICATE KEY UPDATE
// of the key to itself affects no row either); the rows of an order, locked
// until the transaction ends (SQLite has no row locks: a transaction holds
// the database's write lock from its start).
var (
	qInsertPreparation = map[string]string{
		store.Postgres: `INSERT INTO preparation (id, order_id, status, created_at, updated_at) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (order_id) DO NOTHING`,
		store.MySQL: `INSERT INTO preparation (id, order_id, status, created_at, updated_at) VALUES (?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE order_id = order_id`,
	}
	qLockPreparation = map[string]string{
		store.Postgres: `SELECT id, status FROM preparation WHERE order_id = $1 FOR UPDATE`,
		store.SQLite:   `SELECT id, status FROM preparation WHERE order_id = $1`,
	}
	qLockShipment = map[string]string{
		store.Postgres: `SELECT pickup_id, cancelled_at FROM shipment WHERE order_id = $1 FOR UPDATE`,
		store.SQLite:   `SELECT pickup_id, cancelled_at FROM shipment WHERE order_id = $1`,
	}
)

// Queries, written with $n placeholders (store.DB.Q adapts them).
const (
	qStatus            = `SELECT status FROM order_status WHERE order_id = $1`
	qCancelPreparation = `UPDATE preparation SET status = $1, updated_at = $2 WHERE order_id = $3`
	qShipmentExists    = `SELECT count(*) FROM shipment WHERE order_id = $1`
	qShipmentPickup    = `SELECT pickup_id FROM shipment WHERE order_id = $1`
	qInsertShipment    = `INSERT INTO shipment (order_id, pickup_id, idempotency_key, created_at) VALUES ($1, $2, $3, $4)`
	qCancelShipment    = `UPDATE shipment SET cancelled_at = $1 WHERE order_id = $2`
)

// statusCopy is the versioned copy of each order's status.
var statusCopy = inbox.StateCopy{Table: "order_status", Key: "order_id", Version: "version", Columns: []string{"status"}}

// Migrations returns the shipping service's own migrations.
func Migrations() store.Migrations { return migrations }

// ShipmentKey returns the carrier idempotency key of an order's first
// shipment: shipment:<order id>:initial. It is the same at every attempt.
func ShipmentKey(orderID string) string { return "shipment:" + orderID + ":initial" }

// CancelKey returns the carrier idempotency key of the cancellation of an
// order's shipment: shipment:<order id>:cancel. It is the same at every
// attempt, and differs from ShipmentKey: the cancellation is another
// operation.
func CancelKey(orderID string) string { return "shipment:" + orderID + ":cancel" }

// Service is the shipping service.
type Service struct {
	db          *store.DB
	outbox      *outbox.Writer[*sql.Tx]
	carrier     *carrier.Client
	preparation *inbox.Consumer[*sql.Tx]
	pickup      *inbox.Consumer[*sql.Tx]
	log         *slog.Logger
}

// Config configures the shipping service.
type Config struct {
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// BeforeCommit, when set, runs after a handler of the preparation
	// consumer, in its transaction, before it commits: its effects and its
	// processed_event marker are written, not committed. It is a test
	// hook: the shop command built with the tag idemfault kills its process
	// there, to show that the event is handled again, once.
	BeforeCommit func()
}

// New returns the shipping service on db, whose migrations must be applied,
// calling the carrier through c.
func New(db *store.DB, c *carrier.Client, cfg Config) (*Service, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	prep, err := db.NewConsumer(inbox.Config{Name: PreparationConsumer, Logger: log})
	if err != nil {
		return nil, err
	}
	pickup, err := db.NewConsumer(inbox.Config{Name: CarrierConsumer, Logger: log})
	if err != nil {
		return nil, err
	}
	s := &Service{db: db, outbox: db.OutboxWriter(), carrier: c, preparation: prep, pickup: pickup,
		log: log.With("service", "shipping")}
	inbox.HandleJSON(prep, shop.OrderPlaced, beforeCommit(shop.ForOrder(s.onOrderPlaced), cfg.BeforeCommit))
	inbox.HandleJSON(prep, shop.OrderCancelled, beforeCommit(shop.ForOrder(s.onOrderCancelled), cfg.BeforeCommit))
	inbox.HandleJSON(pickup, shop.PreparationCreated, shop.ForOrder(s.onPreparationCreated))
	inbox.HandleJSON(pickup, shop.PreparationCancelled, shop.ForOrder(s.onPreparationCancelled))
	return s, nil
}

// Consumers returns the preparation and carrier consumers.
func (s *Service) Consumers() []*inbox.Consumer[*sql.Tx] {
	return []*inbox.Consumer[*sql.Tx]{s.preparation, s.pickup}
}

// beforeCommit runs h, then hook (Config.BeforeCommit) when h succeeded:
// the effects and the processed_event marker are written, not committed.
// Without a hook, it is h.
func beforeCommit[T any](h inbox.JSONHandlerFunc[*sql.Tx, T], hook func()) inbox.JSONHandlerFunc[*sql.Tx, T] {
	if hook == nil {
		return h
	}
	return func(ctx context.Context, tx *sql.Tx, ev idem.Event, p T) error {
		if err := h(ctx, tx, ev, p); err != nil {
			return err
		}
		hook()
		return nil
	}
}

func (s *Service) onOrderPlaced(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.OrderPlacedV1) error {
	id := p.OrderID
	copied, err := inbox.ApplyState(ctx, s.db.Driver, tx, statusCopy, id, ev.AggregateVersion, "placed")
	if err != nil {
		return err
	}
	status := "placed" // applied: the copy holds this event's status
	if copied.Stale() {
		// A later event came first: read what it left.
		if err := tx.QueryRowContext(ctx, s.db.Q(qStatus), id).Scan(&status); err != nil {
			return err
		}
	}
	if status == "cancelled" {
		// The cancellation arrived first: never prepare a cancelled order.
		s.log.Info("order placed after its cancellation: no preparation", "order_id", id)
		return nil
	}
	now := time.Now().UTC()
	prepID := idem.NewEventID().String()
	res, err := tx.ExecContext(ctx, s.db.Pick(qInsertPreparation), prepID, id, PreparationActive, now, now)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		// Another event already asked for this order's preparation.
		return nil
	}
	out, err := idem.NewEvent(shop.PreparationCreated, shop.AggregatePreparation, id,
		shop.PreparationCreatedV1{OrderID: id, PreparationID: prepID})
	if err != nil {
		return err
	}
	out.AggregateVersion = shop.PreparationCreatedVersion
	return s.outbox.Add(ctx, tx, out)
}

// onOrderCancelled cancels the order's preparation and publishes
// shipping.preparation.cancelled.v1, with the pickup requested already, if
// any: the carrier consumer then cancels it (onPreparationCancelled). An
// order cancelled before its preparation gets the event too, with no
// preparation id, and never gets a preparation.
func (s *Service) onOrderCancelled(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.OrderCancelledV1) error {
	id := p.OrderID
	if _, err := inbox.ApplyState(ctx, s.db.Driver, tx, statusCopy, id, ev.AggregateVersion, "cancelled"); err != nil {
		return err
	}
	// The lock waits for a pickup request in flight (onPreparationCreated
	// holds it): its shipment is then committed and seen below.
	var prepID, status string
	err := tx.QueryRowContext(ctx, s.db.Pick(qLockPreparation), id).Scan(&prepID, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		s.log.Info("order cancelled before its preparation: none will be made", "order_id", id)
	case err != nil:
		return err
	case status != PreparationActive:
		return nil // cancelled already
	default:
		if _, err := tx.ExecContext(ctx, s.db.Q(qCancelPreparation), PreparationCancelled, time.Now().UTC(), id); err != nil {
			return err
		}
	}
	var pickupID string
	err = tx.QueryRowContext(ctx, s.db.Q(qShipmentPickup), id).Scan(&pickupID)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	out, err := idem.NewEvent(shop.PreparationCancelled, shop.AggregatePreparation, id,
		shop.PreparationCancelledV1{OrderID: id, PreparationID: prepID, PickupID: pickupID})
	if err != nil {
		return err
	}
	out.AggregateVersion = shop.PreparationCancelledVersion
	return s.outbox.Add(ctx, tx, out)
}

func (s *Service) onPreparationCreated(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.PreparationCreatedV1) error {
	id := p.OrderID
	// Lock the preparation so that a cancellation waits for the pickup
	// request, or the request sees the cancellation.
	var prepID, status string
	err := tx.QueryRowContext(ctx, s.db.Pick(qLockPreparation), id).Scan(&prepID, &status)
	if errors.Is(err, sql.ErrNoRows) {
		// The event announces a preparation committed with it, and idem's
		// relays publish an event only once its transaction is visible:
		// the row is there. A database that shows it later (a replica
		// behind its primary) will show it: wait, never park, and count
		// it.
		return s.db.NotVisible(ctx, s.log, CarrierConsumer, ev, "preparation", id)
	}
	if err != nil {
		return err
	}
	if status != PreparationActive {
		return nil
	}
	var n int
	if err := tx.QueryRowContext(ctx, s.db.Q(qShipmentExists), id).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	key := ShipmentKey(id)
	pickup, err := s.carrier.RequestPickup(ctx, id, key)
	if err != nil {
		return fmt.Errorf("request pickup for order %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, s.db.Q(qInsertShipment), id, pickup.ID, key, time.Now().UTC()); err != nil {
		return err
	}
	out, err := idem.NewEvent(shop.ShipmentRequested, shop.AggregatePreparation, id,
		shop.ShipmentRequestedV1{OrderID: id, PickupID: pickup.ID, IdempotencyKey: key})
	if err != nil {
		return err
	}
	out.AggregateVersion = shop.ShipmentRequestedVersion
	return s.outbox.Add(ctx, tx, out)
}

// onPreparationCancelled cancels the pickup of a cancelled order at the
// carrier, with its own stable key shipment:<order id>:cancel, records it
// and publishes shipping.shipment.cancelled.v1. With no shipment recorded,
// it still asks the carrier by reference: a pickup request whose answer was
// lost, and whose attempt then failed, may have created one.
func (s *Service) onPreparationCancelled(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.PreparationCancelledV1) error {
	id := p.OrderID
	var (
		pickupID  string
		cancelled sql.NullTime
	)
	err := tx.QueryRowContext(ctx, s.db.Pick(qLockShipment), id).Scan(&pickupID, &cancelled)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		found, err := s.carrier.FindPickup(ctx, id)
		if errors.Is(err, carrier.ErrNoPickup) {
			return nil // nothing was shipped
		}
		if err != nil {
			return fmt.Errorf("look up the pickup of cancelled order %s: %w", id, err)
		}
		s.log.Warn("pickup found at the carrier for a cancelled order with no shipment recorded", "order_id", id, "pickup_id", found.ID)
		pickupID = found.ID
		if _, err := tx.ExecContext(ctx, s.db.Q(qInsertShipment), id, pickupID, ShipmentKey(id), time.Now().UTC()); err != nil {
			return err
		}
	case err != nil:
		return err
	case cancelled.Valid:
		return nil // cancelled already
	}
	key := CancelKey(id)
	if _, err := s.carrier.CancelPickup(ctx, pickupID, key); err != nil {
		return fmt.Errorf("cancel pickup %s of order %s: %w", pickupID, id, err)
	}
	if _, err := tx.ExecContext(ctx, s.db.Q(qCancelShipment), time.Now().UTC(), id); err != nil {
		return err
	}
	out, err := idem.NewEvent(shop.ShipmentCancelled, shop.AggregatePreparation, id,
		shop.ShipmentCancelledV1{OrderID: id, PickupID: pickupID, IdempotencyKey: key})
	if err != nil {
		return err
	}
	out.AggregateVersion = shop.ShipmentCancelledVersion
	return s.outbox.Add(ctx, tx, out)
}
