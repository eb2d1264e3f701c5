// Package idemtest helps test application code that uses idem: what a
// transaction wrote to the outbox, and what a consumer's handlers do with an
// event through the real inbox (deduplication, retries, parking), on a clock
// the test moves. It runs on a fresh SQLite database in a temporary file
// (NewSQLite), fast enough for unit tests, or on any idem driver the test
// gives (postgres.NewPgx(pool) on a schema of its own, with Migrate).
//
// What a transaction wrote:
//
//	tx, _ := db.DB.BeginTx(ctx, nil)
//	err := orders.Place(ctx, tx, order) // the code under test: the order and its event
//	placed := idemtest.RequireAdded(t, idemtest.OutboxTx(db.Driver, tx), "order.order.placed.v1",
//		func(p OrderPlaced) bool { return p.OrderID == order.ID })
//	idemtest.RequireNotAdded(t, idemtest.OutboxTx(db.Driver, tx), "order.order.cancelled.v1")
//	err = tx.Commit() // SQLite has one connection: end the transaction before the consumer runs
//
// What a consumer does with it:
//
//	stock := idemtest.NewConsumer(t, db.Driver, inbox.Config{Name: "stock"})
//	inbox.HandleJSON(stock.Consumer, "order.order.placed.v1", reserve)
//	stock.RequireAppliedOnce(placed.Event) // applied, then a duplicate
//
//	ds := stock.Settle(ev)                 // retried per the policy, then parked
//	parked := stock.RequireParked(ev)      // its error, attempts, bytes
//	stock.Redrive(parked)                  // as "idem failed retry" does, once the cause is fixed
//
// The Require helpers call t.Helper and fail the test with t.Fatalf, saying
// what they found beside what was expected: the events in the outbox, the
// consumer's verdicts, the parked messages.
//
// A Consumer is a real inbox.Consumer driven as a transport drives it, one
// delivery at a time in the test's goroutine. Its clock (inbox.Config.Now)
// is a Clock: a pause after a transient failure ends, and the outage budget
// runs out, when the test advances it (Settle does, by each delay the
// consumer asks for). For the whole path in one process (outbox, relay,
// broker, subscriber), broker/memory has a subscriber; see the root
// package's example.
package idemtest
