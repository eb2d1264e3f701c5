// Package nats is idem's NATS JetStream transport: a Publisher for the relay
// and the failure-store and replay commands, and a Subscriber that feeds an
// idempotent consumer (inbox.Consumer.DeliverBatch).
//
// # Wire contract
//
// Events are stored in one stream (default "EVENTS", file storage, limits
// retention) on subject events.<event name>, for example
// events.order.order.placed.v1. Each message carries the envelope as its
// body and these headers:
//
//	Nats-Msg-Id          the event id: JetStream drops a second copy within
//	                     the stream's duplicate window (default 2m)
//	id                   the event id (as Debezium's Outbox Event Router)
//	eventType            the event name
//	idem-key             the aggregate id (idem.Message.Key)
//	idem-aggregate-type  the aggregate type
//
// plus the event's own headers. Event names must be valid subject tokens
// joined by dots: no spaces, no * or >, no empty token; Publish reports the
// offending message without sending it.
//
// # Consuming
//
// Each consuming service has one durable pull consumer on the stream, named
// after it (SubscriberConfig.Consumer, e.g. "stock"), with explicit acks,
// deliver policy all, and filter subjects from its bindings
// (events.order.> for the binding "order.>") plus its retry subject
// events-retry.stock.>. The stream and the consumer are created or updated
// idempotently at start. Several processes of one service share the
// consumer's messages.
//
// The subscriber gives batches to the DeliverFunc and settles each message
// after it returned, that is after the consumer's transaction committed:
//
//	Ack                       -> Ack
//	Retry after d             -> held, in progress, delivered again after d;
//	                             later messages of its key wait behind it
//	Pause for d               -> held; no new message taken for d
//	parked (failure store)    -> Ack
//	error (could not park)    -> held, delivered again after RequeueDelay
//
// The consumer counts failed attempts in its database (delivery_attempt),
// so its retry policy holds across processes and crashes. The attempt a
// delivery carries, for information, is JetStream's delivery count plus the
// retries the subscriber made of it. The
// consumer's MaxDeliver is unlimited by default: idem's retry policy decides
// when a message is parked. A message left unacknowledged (a crash between
// commit and ack, a lost ack) is delivered again after AckWait, and the
// consumer skips it as a duplicate. While a batch is being handled, and
// while a message is held, the subscriber tells JetStream it is in
// progress, so slow handlers and retry delays do not cause redeliveries.
//
// Messages with the same key go to the same worker, so one aggregate's
// events are handled in stream order, retries included.
//
// Publisher.Inspect (broker.Inspector, for "idem status") tells each
// durable consumer's pending and unacknowledged messages.
//
// # Retries from the failure store, and replays
//
// A parked message is retried with Publisher.Redeliver(ctx, consumer, msgs),
// which "idem failed retry" calls with the message's source (the durable
// consumer's name). It publishes on events-retry.<consumer>.<event name>,
// which only that consumer reads, with a Nats-Msg-Id of its own: publishing
// it again on the event subject would reach every consuming service, and
// JetStream would drop it as a duplicate if its event id were still within
// the duplicate window.
//
// For the same reason, a replay (relay.Replay, "idem replay") of events
// published less than the duplicate window ago is acknowledged by JetStream
// and dropped: replay periods older than the window, or shorten it
// (StreamConfig.Duplicates). The consumer's deduplication, not the window, is
// the guarantee; the window only spares consumers the copies a relay
// publishes again after a crash.
//
// # Embedded server
//
// Package embedded runs a NATS server with JetStream in the process, on a
// data directory that survives restarts, so that an application needs no
// broker installed. The idem and shop commands start one for the broker URL
// "embedded" (or nats://embedded?dir=DIR&listen=127.0.0.1:4222).
package nats
