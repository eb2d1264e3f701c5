// Package nats is idem's NATS JetStream transport: a Publisher for the relay
// and the failure-store and replay commands, and a Subscriber that feeds an
// idempotent consumer (inbox.Consumer.DeliverBatch).
//
// # Wire contract
//
// Events are stored in one stream (default "EVENTS", file storage, limits
// retention) on subject events.<event name>, for example
// events.order.order.placed.v1 (on a partitioned stream,
// events-p.<partition>.<event name>: see Partitions below). Each message
// carries the envelope as its body and these headers:
//
//	Nats-Msg-Id          the event id: JetStream drops a second copy within
//	                     the stream's duplicate window (default 2m)
//	id                   the event id (as Debezium's Outbox Event Router)
//	eventType            the event name
//	idem-key             the aggregate id (idem.Message.Key)
//	idem-aggregate-type  the aggregate type
//
// plus the event's own headers. With PublisherConfig.CloudEvents the body
// is a CloudEvent's data with its attributes in ce- headers, or the JSON
// event format with Content-Type application/cloudevents+json, as the NATS
// binding says. Event names must be valid subject tokens
// joined by dots: no spaces, no * or >, no empty token; Publish reports the
// offending message without sending it.
//
// # Consuming
//
// Each consuming service has one durable pull consumer on the stream, named
// after it (SubscriberConfig.Consumer, e.g. "stock"), with explicit acks,
// deliver policy all, and filter subjects from its bindings
// (events.order.> for the binding "order.>") plus its retry subject
// events-retry.stock.>. The stream is created or updated idempotently at
// start.
//
// # One consumer, several processes: ownership
//
// Several processes of one service do not share a durable consumer's
// messages: that would apply one aggregate's events in two processes at
// once, out of order. One subscriber at a time owns the durable consumer,
// through a lease in the JetStream key-value bucket idem_owners_<stream>
// (key: the durable consumer's name; the bucket's MaxAge is
// SubscriberConfig.OwnerTTL, default 5s, the same for every subscriber of
// the stream: a subscriber configured with another value than the existing
// bucket's refuses to start, ErrOwnerTTL; its replicas follow the
// stream's).
// The owner takes the lease with a create, renews it every OwnerTTL/3 with
// a compare-and-set update, and releases it on Stop. The other processes
// stand by (Subscriber.Active is false; they log it once) and try to take
// the lease every StandbyPoll (default 1s): after a Stop at once, after a
// kill -9 or a freeze once the lease has expired. A subscriber whose renewal
// fails (another took the lease, or it could not renew in time) stops
// fetching at once, hands nothing more to the consumer, leaves what it held
// unacknowledged and stands by.
//
// On taking the lease, a subscriber resets the durable consumer to its
// acknowledgement floor: it deletes it and creates it again, with the same
// configuration, from the first message after the floor (deliver all when
// it did not exist). What a previous owner left unacknowledged is then
// delivered again at once and in stream order, before the later messages;
// without the reset JetStream would deliver it only after AckWait, after
// later messages of the same aggregates (this also holds for one process
// restarted after a crash). Messages acknowledged beyond the floor come
// again and are skipped as duplicates, and JetStream's delivery count
// starts again at 1. The same reset follows a delivery lost on the way (a
// slow-consumer drop, a connection or leader change), which the subscriber
// sees as a gap in the consumer's delivery sequence: it stops before the
// later message rather than let JetStream deliver the lost one after
// AckWait, out of order. The subscriber checks that it still holds the lease
// before it recreates the consumer after a connection loss; it never
// recreates a consumer it does not own. A previous owner that still
// applies a message it held (it froze, the lease expired, it woke up) is
// fenced by the consumer's deduplication: the event's marker in
// processed_event commits with its effects, and whoever comes second skips
// it.
//
// # Partitions: sharing the work
//
// To spread one service's work over several processes, partition the
// stream: StreamConfig.Partitions = P on every publisher and subscriber.
// The publisher sends each event to partition FNV-1a 32(aggregate id) mod
// P, on events-p.<partition>.<event name> (the stream's subjects gain
// events-p.>), so one aggregate's events stay in one partition, in order.
// P is recorded in the stream's metadata (idem_partitions); a publisher or
// subscriber configured with another count fails with ErrPartitions. A
// subscriber reads one partition (SubscriberConfig.Partition = k) through
// the durable consumer <consumer>-p<k>, filtered on
// events-p.<k>.<binding> and its retry subjects
// events-retry.<consumer>-p<k>.>; the source of its deliveries, to which
// "idem failed retry" sends a parked message back, is that durable
// consumer. Each partition's durable consumer has its lease as above: run
// a subscriber of every partition in every process, and each partition is
// consumed by one of them (or let an ownership group of package inbox
// assign the partitions). Publisher.Inspect reports each partition's
// durable consumer. The CLI URLs take ?partitions=P (and, for a
// subscriber, &partition=k).
//
// An unpartitioned stream (the default, Partitions 0) keeps its wire
// format: events.<event name>. To partition an existing stream, or change
// its count: stop the relays, let every consumer drain ("idem status"
// shows nothing waiting), stop the subscribers, call Repartition (which
// refuses while a durable consumer has messages waiting), then start the
// relays and subscribers with the new count. Events published before the
// change stay on their old subjects, where the new durable consumers do
// not look: hence the drain first.
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
// delivery carries, for information, is JetStream's delivery count (since
// the durable consumer was last reset) plus the retries the subscriber
// made of it. The
// consumer's MaxDeliver is unlimited by default: idem's retry policy decides
// when a message is parked. A message left unacknowledged (a crash between
// commit and ack, a lost ack) is delivered again after AckWait (or at once
// to the next owner), and the consumer skips it as a duplicate. While a batch is being handled, and
// while a message is held, the subscriber tells JetStream it is in
// progress, so slow handlers and retry delays do not cause redeliveries.
//
// Messages with the same key go to the same worker, so one aggregate's
// events are handled in stream order, retries included.
//
// Publisher.Inspect (broker.Inspector, for "idem status") tells each
// durable consumer's pending and unacknowledged messages (each
// partition's, on a partitioned stream).
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
