// Package idem holds the types shared by every part of idem: the Event that
// producers write to the outbox and consumers receive, the Message that brokers
// carry, the JSON envelope codec of the wire contract and its CloudEvents 1.0
// codec (CloudEvents, read back by the Decoder), and the errors that cross
// package boundaries.
//
// idem delivers events between services reliably:
//
//   - package outbox writes events in the caller's database transaction, so an
//     event exists if and only if the business change committed;
//   - package relay moves committed outbox rows to a broker, at least once and in
//     per-aggregate order;
//   - package inbox is the idempotent consumer: it records (consumer name, event
//     id) in processed_event in the same transaction as the handlers' effects, so
//     duplicates from any source are skipped and each event's database effects
//     are applied exactly once.
//
// Event ids are UUIDv7 set by the producer (NewEventID); a consumer never makes
// one up on receipt, since an id minted on receipt would be new at every
// delivery.
package idem
