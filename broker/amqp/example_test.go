package amqp_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
)

// The stock service consumes its queue stock.events, bound to every order
// event, and reserves stock once per order event.
func ExampleSubscriber() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("STOCK_DB_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	consumer, err := inbox.New[pgx.Tx](postgres.NewPgx(pool), inbox.Config{Name: "stock"})
	if err != nil {
		log.Fatal(err)
	}
	consumer.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO reservation (order_id) VALUES ($1)`, ev.AggregateID)
		return err
	})

	sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: os.Getenv("AMQP_URL")},
		Queue:      "stock.events",
		Bindings:   []string{"order.#"},
	}, consumer.DeliverBatch)
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer sub.Stop(context.Background())
	// ... run until asked to stop.
}

// The relay (or any producer) publishes through a Publisher.
func ExamplePublisher() {
	pub, err := amqp.NewPublisher(amqp.PublisherConfig{
		ConnConfig: amqp.ConnConfig{URL: os.Getenv("AMQP_URL")},
		Exchange:   "events",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]any{"lines": 2})
	if err != nil {
		log.Fatal(err)
	}
	msg, err := idem.NewMessage(ev)
	if err != nil {
		log.Fatal(err)
	}
	if err := pub.Publish(context.Background(), []idem.Message{msg}); err != nil {
		log.Fatal(err) // errors.Is(err, broker.ErrUnroutable) when no queue is bound
	}
}

// The stock service's work split over 4 partition queues
// (stock.events.p0 to stock.events.p3, by aggregate id): this process
// consumes partitions 0 and 1, another 2 and 3. Any process may also run
// subscribers of partitions another one consumes: they stand by and take
// over when it dies.
func ExampleSubscriberConfig_partitions() {
	ctx := context.Background()
	var consumer *inbox.Consumer[pgx.Tx] // as in the Subscriber example
	for _, k := range []int{0, 1} {
		sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
			ConnConfig: amqp.ConnConfig{URL: os.Getenv("AMQP_URL")},
			Queue:      "stock.events",
			Bindings:   []string{"order.#"},
			Partitions: 4,
			Partition:  k,
		}, consumer.DeliverBatch)
		if err != nil {
			log.Fatal(err)
		}
		if err := sub.Start(ctx); err != nil {
			log.Fatal(err)
		}
		defer sub.Stop(context.Background())
	}
	// ... run until asked to stop.
}
