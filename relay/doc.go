// Package relay moves committed outbox rows to a broker: the polling relay.
//
// A Relay runs Config.Workers workers. Each one, in a loop:
//
//  1. claims a batch of unpublished rows under a lease: a fresh owner token
//     written to lease_owner and an expiry in lease_until, with
//     SELECT ... FOR UPDATE SKIP LOCKED in a short transaction;
//  2. publishes them through a broker.Publisher, which returns once the
//     broker has durably accepted (confirmed) or refused each message;
//  3. marks the confirmed rows published and releases the others, both only
//     where lease_owner is still its token (fencing): a worker that was
//     paused past its lease and lost its rows to another changes nothing.
//     A mark is never sent once the lease has ended.
//
// The steps overlap. A batch's rows are published as chains, one per
// aggregate, in up to four concurrent Publish calls: each call carries the
// next row of the aggregates that are ready, and an aggregate is ready
// again once its row was confirmed. While a batch is published and marked
// (in a goroutine of its own), the worker claims the next one when the
// claim took as many aggregates as it may (more are waiting); on drivers
// that claim in one round trip (driver.OutboxClaimer: pgx on PostgreSQL) a
// worker holds two batches at once, elsewhere one, so that marks never
// wait behind claims for the database's connections.
//
// A relay that dies leaves its leases behind; any worker claims them once
// they expire. Rows are therefore published at least once: a crash between
// the broker's confirm and the mark publishes them again, and consumers skip
// the duplicate (package inbox).
//
// # Order
//
// Events of one aggregate (aggregatetype, aggregateid) are published in seq
// (insertion) order, one Publish call after the other: event k+1 is never
// sent before event k was confirmed. A claim takes only each aggregate's
// head, its unpublished row with the lowest seq, plus up to
// Config.MaxPerAggregate-1 rows that follow it, and never a head whose next
// row is under a live lease; claims on a table are serialised by an advisory
// lock so each sees the leases of the previous ones. Two workers
// therefore never hold rows of one aggregate, and a row committed late by a
// long transaction (a lower seq than rows already visible) is not skipped:
// there is no cursor, it simply becomes its aggregate's head. Unrelated
// aggregates are published in parallel.
//
// # Delayed events
//
// A row whose not_before is set (idem.Event.NotBefore) is not claimed before
// that time, by Config.Now: each claim first makes the rows due by then
// ordinary waiting rows. Until it is due, a delayed row holds back nothing:
// the later rows of its aggregate are published when they are due, and the
// delayed one when it is, after them (once due, it waits for the rows of
// its aggregate already in flight, and goes before those still waiting). A
// worker about to wait longer than Config.PollInterval (MaxPollInterval)
// wakes at the next due time, so a delayed row is published within about a
// poll interval of its time.
//
// # Latency
//
// On PostgreSQL with the pgx driver, a listener (LISTEN on the channel the
// outbox trigger notifies) wakes a worker when rows are inserted; the worker
// waits Config.Debounce so that a burst is one claim. A worker claims until
// a claim finds nothing (with Config.BusyPollInterval set, it claims again
// after it, notified or not); then it waits for a notification, or polls every
// Config.PollInterval with jitter (doubled after each empty poll up to
// Config.MaxPollInterval when that is set), so lost notifications only add
// delay. Processes that write the outbox themselves call Relay.Notify after
// committing.
//
// Notifications cost producers: each notifying commit holds a lock global to
// the PostgreSQL server until its WAL flush. Since migration 0006 the trigger
// notifies only while a relay waits (driver.OutboxWaitListener): the
// listener holds an advisory lock while the relay has nothing to claim, and
// inserts notify only when they cannot take it shared. Before it waits, the
// relay takes the lock, which waits for every transaction that inserted
// without notifying, and claims once more if the database holds rows a
// claim could take (one cheap query on the listener's connection, so that
// a relay that keeps up claims once per wake-up, not twice); at the first
// notification it gives the lock back and claims until a claim finds
// nothing. Producers
// thus notify once per wake-up of a waiting relay, not once per commit (with
// BusyPollInterval set, a relay that keeps up with a steady stream is never
// notified).
//
// # Failures and quarantine
//
// A row the broker refuses itself (an error for that message in a
// *broker.BatchError: unroutable, nacked, rejected, too large) is released
// with its attempt count incremented, its last error recorded and a retry
// delay (Config.RetryBackoff, doubled per attempt, with jitter): it holds
// back only its own aggregate. On its Config.QuarantineAfter-th refusal it is
// quarantined. A row that cannot become a message (written by another
// program with an empty id or one over 64 bytes, headers that are not a JSON
// object, no event name...) is quarantined at its first claim: claims never
// fail on a row's content. An id that is not a UUID but 1 to 64 bytes of
// text is published under the UUID idem.EventID derives from it, with the
// id in the header idem.HeaderOriginalID.
//
// A quarantined row stays in the outbox, unpublished, with quarantined_at set
// and its error in last_error. Claims skip it; the later rows of its
// aggregate wait behind it, so that order holds; every other aggregate flows.
// Each quarantine is logged at error level and counted (Stats.Quarantined,
// Stats.QuarantinedRows). Operators list, show, re-drive (the relay publishes
// the row at its next claim, then the rows behind it) and remove quarantined
// rows with "idem failed ... --relay", or driver.RelayDialect's
// ListQuarantined, GetQuarantined, RequeueQuarantined and DeleteQuarantined.
//
// When the broker fails whole calls, or answers no message of a call in
// time, every worker pauses with the same backoff. Such failures are faults,
// not bad input: they record the error but count no attempt, so a broker
// that is away, however long, never gets a row quarantined. Rows are never
// dropped.
//
// # Retention and replay
//
// Published rows stay in the outbox for Config.Retention, then are deleted in
// batches of Config.DeleteBatchSize. Until then, Replay (and "idem replay")
// can publish the events of a period again, with their original ids. The
// CDC relays (relay/cdc, relay/binlog) leave no published row: they keep
// what they published in the outbox's archive (migration 0013 on
// PostgreSQL and MySQL/MariaDB) for their ArchiveRetention, and Replay reads
// it besides the outbox's published rows (Archive describes it). The
// retention is therefore the replay window: consumers must keep their
// processed_event markers at least that long (inbox.PurgeConfig.ReplayWindow),
// or a replay would apply events a second time.
//
// # Running
//
//	pub := ... // a broker.Publisher: broker/amqp, broker/kafka, broker/nats, broker/webhook
//	r, err := relay.New(postgres.NewPgx(pool), pub, relay.Config{Workers: 4})
//	if err != nil { ... }
//	if err := r.Start(ctx); err != nil { ... }
//	...
//	err = r.Stop(shutdownCtx) // stop claiming, finish or release in-flight rows
//
// Stats returns counters and the backlog; package relaymetrics exports them
// to Prometheus. The idem command runs a relay with "idem relay".
package relay
