// Package drivertest is the conformance suite of idem's database dialects.
// A dialect package runs it from a test against a real database, once per
// connection API the dialect has, with the driver of that API:
//
//	func TestConformance(t *testing.T) {
//		drivertest.Run(t, func(t *testing.T, o drivertest.Options) *drivertest.DB[*sql.Tx] {
//			db := testdb.NewMariaDB(t, testdb.Options{NoMigrate: o.NoMigrate})
//			return &drivertest.DB[*sql.Tx]{Driver: db.Driver, Schema: db.Name, ...,
//				Features: drivertest.Features{TimeArg: sqltime.Arg}}
//		})
//	}
//
// driver/postgres runs it twice (pgx.Tx on the pgx driver, *sql.Tx on the
// pgx stdlib driver), driver/mysql and driver/sqlite once each.
//
// Every check runs through the driver under test: its Pool for the
// statements the suite writes itself, its transactions for the real code
// paths it drives (migrate.Migrator, outbox.Writer, inbox.Consumer, the
// relay dialect operations and a running relay.Relay). It checks the
// guarantees every dialect gives: migrations up, no-op, status, down,
// concurrent, cancelled, and refusal of a newer schema; outbox rows that
// exist if and only if their transaction committed; deduplication on the
// processed_event key only, with concurrent deliveries of one event applied
// once; payload hashes; the consumer's failure model (attempts counted in
// the database, retries then parking, messages parked at once, a parked
// event holding its aggregate, re-drives); the failure store, one entry per
// parked message (its migration included), byte for byte whatever the
// bytes, with paging, aggregates and held messages; attempt
// counts; the purges; which errors are transient; errors in the middle of a
// result reaching the caller (FaultExecutor); versioned state copies; the
// relay's claims (aggregate heads only, fencing, retry delays, retention,
// quarantine), per-aggregate order and wake-ups; delayed rows (not claimed
// before their time by the claim's clock, holding back nothing of their
// aggregate, counted as scheduled, published at their time by a relay that
// backed off); outbox ids that are not
// UUIDs (published under idem.EventID's derived id, applied once by a
// consumer, quarantined when empty or over 64 bytes); the idempotency key
// store; the status figures (driver.StatusReader: backlog, last
// publish, each consumer's last processed time, recent markers, parked
// messages and retries); and, on the dialects that have one, the CDC
// relays' archive (driver.OutboxArchiver: what a replay reads of it, in
// order and by page, its purge, each outbox's events apart).
//
// The suite has no branch on a dialect's name. What differs between
// databases is either asked of the driver (a driver.OutboxListener is
// checked waking a relay, a driver.OutboxClaimer claims in the relay
// checks, MigrationSupport.TransactionalDDL is checked against the
// database) or declared in Features (placeholders, how a time is passed,
// typed UUID columns, dynamic typing, a single writer), which CheckFeatures
// tests against the database: a wrong declaration fails, it never leaves
// checks out.
//
// A Setup makes a fresh database for each test; the tests run in parallel.
package drivertest
