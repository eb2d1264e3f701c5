// Package kafka is idem's Kafka transport, on franz-go: a Publisher for the
// relay and a Subscriber feeding an idempotent consumer (package inbox).
//
// # Wire format
//
// As Debezium's Outbox Event Router routes events: topic
// outbox.event.<aggregate_type> (see PublisherConfig.RouteByField and
// TopicReplacement for Debezium's route.by.field and
// route.topic.replacement), record key = aggregate id, so that the events of
// one aggregate share a partition and keep their order, headers "id" (event
// id) and "eventType" (event name), value = the idem JSON envelope, or the
// bare payload with ValueFormat DebeziumPayload, or a CloudEvent with
// PublisherConfig.CloudEvents (the Kafka binding: ce_ headers and the
// payload as the value, or the JSON event format). The producer is idempotent
// with acks=all, and Publish returns once every record is acknowledged, with
// one error per record that was not.
//
//	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
//		ClientConfig: kafka.ClientConfig{Brokers: []string{"localhost:9092"}},
//	})
//	r, err := relay.New(drv, pub, relay.Config{})
//
// # Consuming
//
// A Subscriber joins a consumer group and processes its partitions in
// parallel, each in offset order, handing batches of records to a
// DeliverFunc, normally inbox.Consumer.DeliverBatch, which reads idem
// envelopes, Debezium's records and CloudEvents:
//
//	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
//		ClientConfig: kafka.ClientConfig{Brokers: []string{"localhost:9092"}},
//		Group:        "shipping",
//		Topics:       []string{"outbox.event.order"},
//	}, consumer.DeliverBatch)
//	err = sub.Start(ctx)
//	defer sub.Stop(context.Background())
//
// The order of the commits is the one that makes a crash harmless: the
// consumer's database transaction (effects and processed_event markers)
// commits first, then the offsets. A process that dies in between gets the
// records again and the consumer skips them as duplicates. An offset is
// committed only up to the end of an unbroken run of records that were
// handled or parked, so it never passes a record still failing (G5).
//
// A record whose handler fails is retried in place, with the consumer's
// retry policy: its partition waits, since the order of an aggregate's events
// matters, while the other partitions go on. When the retries run out the
// consumer parks it in its failure store (failed_message), or, with
// SubscriberConfig.DeadLetter, the subscriber produces it to a dead-letter
// topic, and the partition moves on. A record that cannot even be parked (the
// database is down) holds its partition until it can.
//
// On a rebalance, revoked partitions finish the batch in progress, abandon
// retry waits, and commit what is done before they are given up.
//
// # Metrics
//
// Subscriber.Stats reports handled, retried, parked and dead-lettered
// records, commits, a histogram of the delay from an event's occurrence to
// the end of its handling, and each partition's committed offset, end offset
// and lag. SubscriberConfig.ObserveDelay feeds the same delays to a metrics
// system of your choice. Publisher.Inspect (broker.Inspector, for "idem
// status") tells each consumer group's lag from outside the consumers.
package kafka
