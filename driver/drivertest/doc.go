// Package drivertest is the conformance suite of idem's database dialects.
// Every dialect package runs it from a test against a real database:
//
//	func TestConformance(t *testing.T) {
//		drivertest.Run(t, func(t *testing.T, o drivertest.Options) *drivertest.DB {
//			db := testdb.NewMariaDB(t, testdb.Options{NoMigrate: o.NoMigrate})
//			return &drivertest.DB{Driver: db.Driver, ...}
//		})
//	}
//
// The suite drives the real code paths (migrate.Migrator, outbox.Writer,
// inbox.Consumer over driver.SQLDriver, the relay dialect operations and a
// running relay.Relay) and checks the guarantees every dialect gives:
// migrations up, no-op, status, down and refusal of a newer schema; outbox
// rows that exist if and only if their transaction committed; deduplication
// on the processed_event key only, with concurrent deliveries of one event
// applied once; payload hashes; the failure store, byte for byte whatever
// the bytes, with paging, aggregates and held messages; attempt counts; the
// purges; which errors are transient; errors in the middle of a result
// reaching the caller (FaultExecutor); versioned state copies; and the
// relay's claims (aggregate heads only, fencing, retry delays, retention)
// and per-aggregate order.
//
// A Setup makes a fresh database for each test; the tests run in parallel.
package drivertest
