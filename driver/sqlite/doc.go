// Package sqlite is idem's SQLite dialect, for database/sql with
// modernc.org/sqlite (pure Go, no cgo). It suits embedded deployments and
// tests: one process, one database file.
//
// A tour:
//
//	db, err := sqlite.Open("shop.db")        // WAL, busy timeout, immediate transactions
//	drv := sqlite.New(db)                    // a driver.Driver[*sql.Tx]
//	_, err = migrate.New(drv).Up(ctx)        // outbox, processed_event, failed_message
//	w := outbox.NewWriter(drv)               // write events in your *sql.Tx
//	c, err := inbox.New(drv, inbox.Config{Name: "stock"})
//
// SQLite has one writer at a time. Open configures connections so that
// concurrent use from one process waits instead of failing with "database is
// locked": WAL journaling, a busy timeout, and immediate transactions (see
// DSN). Use Open, or a DSN with the same settings.
//
// Deduplication uses INSERT ... ON CONFLICT (consumer_name, event_id) DO
// NOTHING. Two workers delivering one event are serialised by the write
// lock: the second waits, then finds the marker.
//
// The relay is single-writer: a claim is plain reads and an UPDATE in a
// transaction holding the write lock, with the same per-aggregate semantics
// as the other dialects; there is no FOR UPDATE SKIP LOCKED and no
// LISTEN/NOTIFY (relays poll).
//
// SQLite has no schemas: Tables.Schema must be empty. Timestamps are stored
// as UTC text ("2006-01-02 15:04:05.000000"), event ids as UUID text.
package sqlite
