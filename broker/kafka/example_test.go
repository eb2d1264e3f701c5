package kafka_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/inbox"
)

// A publisher and a subscriber on an in-process Kafka cluster. In an
// application the DeliverFunc is an inbox.Consumer's DeliverBatch, which
// deduplicates and handles each event in a database transaction.
func Example() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "outbox.event.order"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	client := kafka.ClientConfig{Brokers: cluster.ListenAddrs(), Logger: quiet}
	ctx := context.Background()

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{ClientConfig: client})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	var msgs []idem.Message
	for _, name := range []string{"order.order.placed.v1", "order.order.paid.v1", "order.order.shipped.v1"} {
		ev, _ := idem.NewEvent(name, "order", "42", map[string]int{"orderId": 42})
		m, _ := idem.NewMessage(ev)
		msgs = append(msgs, m)
	}
	if err := pub.Publish(ctx, msgs); err != nil {
		panic(err)
	}

	done := make(chan struct{})
	seen := 0
	deliver := func(_ context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
		disps := make([]inbox.Disposition, len(ds))
		for i, d := range ds {
			ev, _ := idem.Decode(d.Message)
			fmt.Println(ev.AggregateID, ev.Name)
			disps[i] = inbox.Disposition{Action: inbox.Ack, Outcome: inbox.Applied}
			if seen++; seen == len(msgs) {
				close(done)
			}
		}
		return disps, make([]error, len(ds))
	}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		ClientConfig: client,
		Group:        "shipping",
		Topics:       []string{"outbox.event.order"},
	}, deliver)
	if err != nil {
		panic(err)
	}
	if err := sub.Start(ctx); err != nil {
		panic(err)
	}
	<-done
	if err := sub.Stop(ctx); err != nil {
		panic(err)
	}
	// Output:
	// 42 order.order.placed.v1
	// 42 order.order.paid.v1
	// 42 order.order.shipped.v1
}
