// Package amqp is idem's RabbitMQ transport, on github.com/rabbitmq/amqp091-go.
//
// The topology is the usual one for events between services: one durable
// topic exchange ("events"), routing key = event name, and one durable queue
// per consuming service ("stock.events") bound with patterns such as
// "order.#". Queues are classic queues declared as version 2, or quorum
// queues (SubscriberConfig.QueueType). Every declaration is idempotent.
//
// A Publisher publishes persistent messages with message_id = event id,
// type = event name and content type application/json, with publisher
// confirms and the mandatory flag: a message no queue is bound for fails
// with broker.ErrUnroutable instead of vanishing. It implements
// broker.Publisher, so the relay publishes through it. With
// PublisherConfig.CloudEvents it publishes CloudEvents instead of the
// envelope, as the AMQP binding says (cloudEvents_ headers and the content
// type property, or the JSON event format):
//
//	pub, err := amqp.NewPublisher(amqp.PublisherConfig{
//		ConnConfig: amqp.ConnConfig{URL: "amqp://guest:guest@localhost:5672/"},
//	})
//
// A Subscriber consumes one queue with manual acks and a prefetch window,
// groups deliveries in batches (up to BatchSize messages or BatchLinger) and
// hands them to an idempotent consumer, inbox.Consumer.DeliverBatch, on
// Workers goroutines; the messages of one aggregate always go to the same
// worker. It acknowledges a message only after the consumer committed it or
// parked it in the failure store:
//
//	consumer, _ := inbox.New[pgx.Tx](postgres.NewPgx(pool), inbox.Config{Name: "stock"})
//	consumer.Handle("order.order.placed.v1", reserveStock)
//	sub, _ := amqp.NewSubscriber(amqp.SubscriberConfig{
//		ConnConfig: amqp.ConnConfig{URL: url},
//		Queue:      "stock.events",
//		Bindings:   []string{"order.#"},
//	}, consumer.DeliverBatch)
//	if err := sub.Start(ctx); err != nil { ... }
//	defer sub.Stop(context.Background())
//
// # Several processes of one consumer
//
// A subscriber is its queue's only consumer: it consumes a classic queue
// with the exclusive flag (this works on queues declared by earlier
// versions), and declares a quorum queue with x-single-active-consumer
// (RabbitMQ accepts the exclusive flag on a quorum queue but ignores it).
// A second process of the same consumer stands by: it logs so once, tries
// again every SubscriberConfig.StandbyPoll (1s), and Subscriber.Active
// tells which one consumes. When the active process stops or dies, RabbitMQ
// puts the messages it had not acknowledged back at the head of the queue,
// in order, and a standby takes over; a frozen process keeps the queue
// until its connection's heartbeat times out. So one aggregate's events are
// applied in order, one at a time, whatever runs: extra processes are
// spares, not extra throughput. A quorum queue that exists without
// x-single-active-consumer is refused with the steps to migrate it.
//
// # Partitions
//
// To share a consumer's work between processes, set
// SubscriberConfig.Partitions to P and run one subscriber per partition k
// (Partition, 0 to P-1), typically with inbox's ownership group, which
// spreads the partitions over the running processes. Every message the
// Publisher sends carries the header "idem-bucket" (HeaderBucket): the
// bucket of its aggregate, FNV-1a 32 of the key modulo 64 (Bucket, Buckets;
// the hash broker/nats uses for its partitions). The subscribers declare
// the queues "<Queue>.p0" to "<Queue>.p<P-1>" and a headers exchange
// "<Queue>.part<P>" (PartitionExchange) bound to the events exchange with
// the Bindings, which sends bucket b to "<Queue>.p<b mod P>" (one binding
// per bucket: x-match all, idem-bucket b). Every message goes to exactly one
// partition queue, an aggregate's always to the same one, and the mapping
// is fixed by the bindings, stored with the exchange: it survives broker
// restarts and needs no plugin. P is at most 64 (PartitionsMax), the
// number of buckets. Each partition queue is consumed as above, by one
// subscriber at a time. Publisher.Inspect reports each partition queue.
//
// A message without the bucket header (sent by another publisher, or by an
// idem publisher older than the partitions) is not lost: the partition
// exchange's alternate exchange, the fanout exchange "<Queue>.nobucket"
// (NoBucketExchange), puts every such message into "<Queue>.p0", in order.
// Upgrade the publishers (relays) before partitioning a consumer, or its
// partition 0 takes all the work.
//
// The partition count is in the exchange's name so that changing it cannot
// leave a bucket bound to two queues: a subscriber deletes the partition
// exchanges of the other counts ("<Queue>.part1" to "<Queue>.part64") and the
// "<Queue>.hash" consistent-hash exchange of earlier idem versions, with
// their bindings, when it starts. Still, a consumer's P must not change
// while messages wait (an aggregate's waiting events would be overtaken by
// later ones in its new partition), and the subscribers of one consumer must
// all run with the same P (each would delete the others' exchange). Changing
// P, moving an unpartitioned consumer to partitions, or upgrading from the
// consistent-hash partitions of earlier versions is a drain then switch:
// stop the relays that publish to the exchange (the outbox keeps the
// events), let the running subscribers empty their queues ("idem status"
// shows nothing waiting), stop them all, delete (rabbitmqctl delete_queue)
// the emptied queues that the new settings do not use and that keep their
// bindings otherwise: the unpartitioned queue "<Queue>" after a move to
// partitions, the partition queues after a move back to P = 0 (each would
// receive a copy of every message); then start the subscribers with the
// new settings, then the relays. After P decreased, the partition queues
// "<Queue>.p<k>" for k >= P lose their bindings with the old exchange and
// get nothing more: delete them too.
//
// # Retries and the failure store
//
// When a handler fails and the consumer's retry policy allows another
// attempt, the subscriber keeps the message unacknowledged and delivers it
// again after the policy's delay; the later messages of its aggregate (same
// key header) wait behind it, so one aggregate's events are applied in
// order through retries, while other aggregates go on. The consumer counts
// attempts in its database (delivery_attempt), so a restart does not reset
// them. After the last attempt, for a permanent error (idem.Permanent), or
// at once for a body that cannot be decoded, the consumer stores the raw
// message, its headers, the error and the attempt count in failed_message
// and the subscriber acknowledges it: such a message never loops in the
// queue. "idem failed retry" sends a stored message back to its queue with
// Publisher.Redeliver.
//
// Publisher.Inspect (broker.Inspector, for "idem status") tells the messages
// ready in each consumer's queue and its consumers, by a passive declare.
//
// When the consumer pauses (its own database, or a dependency a handler
// reports with idem.Transient, is away), the subscriber stops taking
// messages and delivers the held ones again when the pause ends: the
// messages stay in RabbitMQ, no attempt is counted and nothing is parked.
//
// # Duplicates
//
// RabbitMQ's redelivered flag is not used to spot duplicates: a relay that
// republishes after a crash produces a copy without it, and a redelivered
// message may never have been processed. Every delivery goes through the
// consumer's deduplication on processed_event.
//
// # Connections
//
// Publisher and Subscriber reconnect with exponential, jittered backoff
// (100ms to 2s by default) after a broker restart or a lost connection. A Publish call that meets a
// lost connection returns an error (the relay keeps its rows and publishes
// them again); a subscriber's unacknowledged messages are redelivered by the
// broker and deduplicated. Channel-level errors (a missing exchange, a queue
// declared with other arguments) are returned with the broker's reply code
// and text. TLS is used for amqps:// URLs; credentials come from the URL or
// from ConnConfig.Username/Password, and passwords never appear in logs or
// errors.
//
// For a cluster, list its nodes in one URL, separated by commas; they share
// the credentials, vhost and parameters:
//
//	amqp://user:pass@rabbit1:5672,rabbit2:5672,rabbit3:5672/vhost
//
// The first connection goes to the first node that answers, in the order
// listed; after a connection is lost, the next attempt starts with the node
// after the one that was lost and goes round the list, so that a dead or
// frozen node is tried last. Use quorum queues (SubscriberConfig.QueueType)
// so that the queue and its messages survive a node: a message is confirmed
// once a majority of the queue's members has it. A channel whose messages
// were refused (nacked) is closed, not reused: after the death of a quorum
// queue leader's node, RabbitMQ 3.10 can nack every later message on a
// channel that published to it.
package amqp
