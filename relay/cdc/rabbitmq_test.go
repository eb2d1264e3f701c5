package cdc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/outbox"
)

// To RabbitMQ with publisher confirms: 2,000 events of 100 aggregates, half
// rows and half WAL messages, arrive each once, every aggregate in order.
func TestRabbitMQOrder(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	exchange := testamqp.Name("idem_t_cdc_")
	queue := exchange + ".events"
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	})
	pub, err := amqp.NewPublisher(amqp.PublisherConfig{
		ConnConfig: amqp.ConnConfig{URL: url, ReconnectMax: 500 * time.Millisecond, Logger: testLogger(t)},
		Exchange:   exchange,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	pg := newDB(t)
	start(t, pg, pub, fastConfig(t))
	rows := outbox.NewWriter(pg.Driver)
	wal, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	const aggs, versions = 100, 20
	ctx := context.Background()
	for v := 1; v <= versions; v++ {
		var evs []idem.Event
		for a := range aggs {
			evs = append(evs, event(t, fmt.Sprint(a), v))
		}
		w := rows
		if v%2 == 0 {
			w = wal
		}
		if err := w.AddExec(ctx, pg.Driver.Pool(), evs...); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uuid.UUID]bool{}
	last := map[string]int64{}
	deadline := time.Now().Add(time.Minute)
	for len(seen) < aggs*versions {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d events arrived", len(seen), aggs*versions)
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		id, _ := uuid.Parse(d.MessageId)
		ev, err := idem.Decode(idem.Message{EventID: id, EventName: d.Type, Body: d.Body})
		if err != nil {
			t.Fatal(err)
		}
		if seen[ev.ID] {
			t.Fatalf("event %s arrived twice", ev.ID)
		}
		seen[ev.ID] = true
		if ev.AggregateVersion != last[ev.AggregateID]+1 {
			t.Fatalf("aggregate %s: version %d after %d", ev.AggregateID, ev.AggregateVersion, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.AggregateVersion
	}
}
