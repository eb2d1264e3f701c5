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
// broker.Publisher, so the relay publishes through it:
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
package amqp
