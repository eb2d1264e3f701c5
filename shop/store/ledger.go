package store

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
)

// The application ledger is the shop's audit trail for its chaos checker
// (shopctl chaos --random): the table applied_event, in each service's
// database, gets one row each time one of the service's consumers applies
// an event, in the consumer's transaction, so that the row exists exactly
// when the event's effects were committed. Unlike processed_event, whose
// primary key makes a second marker of an event impossible, it has no key
// on (consumer, event): an event applied twice (its marker skipped, lost or
// purged) shows as two rows, whatever the handlers' own idempotence (a
// unique constraint, an idempotency key at the carrier) makes of its
// effects. seq numbers the rows in the order they were written, which for
// one consumer and one aggregate is the order of its applications.
//
// The shop command records the ledger only in builds with the tag
// idemfault, the ones shopctl chaos runs (cmd/shop); the table exists in
// every build, so that one database serves both. Nothing purges it: it is
// for test runs, not production.
var ledgerMigrations = Migrations{
	Postgres: {`
CREATE TABLE applied_event (
    seq               bigint       GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_name     varchar(200) NOT NULL,
    event_id          varchar(36)  NOT NULL,
    event_name        varchar(255) NOT NULL,
    aggregate_type    varchar(255) NOT NULL,
    aggregate_id      varchar(255) NOT NULL,
    aggregate_version bigint       NOT NULL,
    applied_at        timestamptz  NOT NULL
);
`},
	MySQL: {`
CREATE TABLE applied_event (
    seq               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer_name     VARCHAR(200) NOT NULL,
    event_id          VARCHAR(36)  NOT NULL,
    event_name        VARCHAR(255) NOT NULL,
    aggregate_type    VARCHAR(255) NOT NULL,
    aggregate_id      VARCHAR(255) NOT NULL,
    aggregate_version BIGINT       NOT NULL,
    applied_at        DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
`},
	SQLite: {`
CREATE TABLE applied_event (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer_name     TEXT      NOT NULL,
    event_id          TEXT      NOT NULL,
    event_name        TEXT      NOT NULL,
    aggregate_type    TEXT      NOT NULL,
    aggregate_id      TEXT      NOT NULL,
    aggregate_version INTEGER   NOT NULL,
    applied_at        timestamp NOT NULL
);
`},
}

// ledgerVersions records the versions of ledgerMigrations applied.
const ledgerVersions = "shop_ledger_migration"

const qInsertApplied = `INSERT INTO applied_event (consumer_name, event_id, event_name, aggregate_type, aggregate_id, aggregate_version, applied_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

// RecordApplications adds to every event name c handles a last handler
// that writes a row of the application ledger (applied_event) in the
// consumer's transaction: the consumer's name, the event's id, name,
// aggregate and aggregate version. Call it once c's own handlers are
// registered; c must be a consumer on db. It uses only the consumer's
// public API (EventNames, Handle): handlers of one event run in the order
// they were registered, in one transaction, and only when the event is not
// a duplicate.
func (db *DB) RecordApplications(c *inbox.Consumer[*sql.Tx]) {
	name, insert := c.Name(), db.Q(qInsertApplied)
	for _, ev := range c.EventNames() {
		c.Handle(ev, func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
			_, err := tx.ExecContext(ctx, insert, name, ev.ID.String(), ev.Name, ev.AggregateType, ev.AggregateID, ev.AggregateVersion, time.Now().UTC())
			if err != nil {
				return fmt.Errorf("record the application of %s %s in applied_event: %w", ev.Name, ev.ID, err)
			}
			return nil
		})
	}
}

// NotVisibleMessage is the message of the warning NotVisible logs: the
// chaos checker counts these lines in the processes' logs.
const NotVisibleMessage = "an event announces a row that its database does not show yet"

// NotVisible is what a handler returns when the row its event announces,
// committed in the same transaction as the event, is not in the database
// (the producer's, which is this one): what, of order orderID. idem's
// relays publish an event only once its transaction is visible to other
// sessions (G13), so this never happens with them; a database that shows a
// commit later (a replica behind its primary) would, and the consumer then
// waits: the error is idem.Transient, never parked. Each time is counted
// (NotVisibleCount, the shop's metric shop_rows_not_visible_total) and
// logged at warning level.
func (db *DB) NotVisible(ctx context.Context, log *slog.Logger, consumer string, ev idem.Event, what, orderID string) error {
	db.notVisible.Add(1)
	log.WarnContext(ctx, NotVisibleMessage, "database", db.Service, "consumer", consumer,
		"event_id", ev.ID, "event_name", ev.Name, "missing", what, "order_id", orderID)
	return idem.Transient(fmt.Errorf("no %s for order %s yet, although event %s announces one", what, orderID, ev.ID))
}

// NotVisibleCount returns how many times NotVisible was called on db.
func (db *DB) NotVisibleCount() uint64 { return db.notVisible.Load() }
