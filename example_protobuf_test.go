package idem_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// A Protobuf payload, end to end: the producer marshals a message (here the
// well-known structpb.Struct; your own generated types work the same way)
// and gives the event a content type that is not JSON, so that its Payload
// holds the raw bytes. The outbox stores them as they are (payload_binary),
// the relay publishes them (base64 in idem's JSON envelope, the raw bytes as
// the body of a CloudEvent in binary mode), and the consumer receives the
// content type and the same bytes, which it unmarshals.
func Example_protobuf() {
	ctx := context.Background()
	db, err := sqlite.Open(":memory:")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		log.Fatal(err)
	}

	// The consumer: Handle, not HandleJSON, which parks what is not JSON.
	stock, err := inbox.New(drv, inbox.Config{Name: "stock"})
	if err != nil {
		log.Fatal(err)
	}
	stock.Handle("order.order.placed.v1", func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
		if ev.ContentType != "application/x-protobuf" {
			return idem.Permanent(fmt.Errorf("unexpected content type %q", ev.ContentType))
		}
		var order structpb.Struct
		if err := proto.Unmarshal(ev.Payload, &order); err != nil {
			return idem.Permanent(err) // bytes that are not the message: parked
		}
		f := order.GetFields()
		fmt.Printf("%s: order %s, %v x %s\n", ev.ContentType, f["order_id"].GetStringValue(),
			f["quantity"].GetNumberValue(), f["product_id"].GetStringValue())
		return nil
	})

	events := memory.New()
	sub, err := events.NewSubscriber(memory.SubscriberConfig{Consumer: "stock"}, stock.DeliverBatch)
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer sub.Stop(ctx)
	rel, err := relay.New(drv, events, relay.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := rel.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer rel.Stop(ctx)

	// The producer.
	order, err := structpb.NewStruct(map[string]any{"order_id": "42", "product_id": "p-1", "quantity": 2})
	if err != nil {
		log.Fatal(err)
	}
	payload, err := proto.Marshal(order)
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	ev := idem.Event{
		ID:            idem.NewEventID(),
		Name:          "order.order.placed.v1",
		AggregateType: "order",
		AggregateID:   "42",
		ContentType:   "application/x-protobuf",
		Payload:       payload,
	}
	if err := outbox.NewWriter(drv).Add(ctx, tx, ev); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	rel.Notify()

	if err := events.WaitLen(ctx, 1); err != nil {
		log.Fatal(err)
	}
	if err := events.WaitPending(ctx, "stock"); err != nil {
		log.Fatal(err)
	}
	var stored []byte
	if err := db.QueryRowContext(ctx, `SELECT payload_binary FROM outbox`).Scan(&stored); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("stored %d bytes as they are: %v; applied %d\n", len(stored), string(stored) == string(payload), stock.Stats().Applied)
	// Output:
	// application/x-protobuf: order 42, 2 x p-1
	// stored 62 bytes as they are: true; applied 1
}
