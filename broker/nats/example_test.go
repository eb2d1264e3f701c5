package nats_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/inbox"
)

// A publisher and a stock subscriber on an embedded server. In an
// application, the subscriber feeds consumer.DeliverBatch of an
// inbox.Consumer, and the relay publishes through the publisher.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "idem-nats-example")
	defer os.RemoveAll(dir)

	srv, err := embedded.Start(ctx, embedded.Config{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	nc, err := srv.Connect()
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	pub, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{Conn: nc}})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	received := make(chan inbox.Delivery, 1)
	sub, err := nats.NewSubscriber(nats.SubscriberConfig{
		ConnConfig: nats.ConnConfig{Conn: nc},
		Consumer:   "stock",
		Bindings:   []string{"order.>"},
	}, func(ctx context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
		out := make([]inbox.Disposition, len(ds))
		for i, d := range ds {
			received <- d
			out[i] = inbox.Disposition{Action: inbox.Ack, Outcome: inbox.Applied}
		}
		return out, make([]error, len(ds))
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer sub.Stop(ctx)

	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]string{"orderId": "42"})
	msg, _ := idem.NewMessage(ev)
	if err := pub.Publish(ctx, []idem.Message{msg}); err != nil {
		log.Fatal(err)
	}
	d := <-received
	fmt.Println(d.Message.EventName, string(d.Message.Key), d.Source, d.Attempt)
	// Output:
	// order.order.placed.v1 42 stock 1
}
