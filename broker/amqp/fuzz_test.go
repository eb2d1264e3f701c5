package amqp

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
)

// FuzzToDelivery feeds toDelivery AMQP deliveries with any body, properties
// and headers (of the types AMQP tables hold): it must not panic, must keep
// the body as received, and what it produces must decode or be rejected
// with idem.ErrUndecodable, so that the consumer parks it. The same inputs
// also make an event, published as the Publisher does, as an envelope and as
// a CloudEvent in both modes: the consumer must get it back as the envelope
// says.
func FuzzToDelivery(f *testing.F) {
	id := "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	f.Add([]byte(brokertest.FuzzEnvelope), "order.order.placed.v1", "events", "order.order.placed.v1", id, "", "42", "1", "v", int64(0))
	f.Add([]byte(`{"orderId":42}`), "OrderCreated", "", "stock.events", "", id, "42", "", "", int64(3))
	f.Add([]byte(`"{\"orderId\":42}"`), "", "events", "order.order.placed.v1", id, id, `{"schema":{},"payload":"42"}`, "x", "\xff", int64(-1))
	f.Add([]byte("\xff\xfe"), "\x00", "\xff", "", "not-a-uuid", "{"+id+"}", "", "-3", "\x00", int64(1<<40))
	f.Add([]byte(`[]`), "", "", "", "", "", "", "99999999999999999999", "", int64(7))
	f.Fuzz(func(t *testing.T, body []byte, typ, exchange, routingKey, messageID, idHeader, key, attempt, value string, n int64) {
		headers := amqp091.Table{
			"x-int":   n,
			"x-bytes": []byte(value),
			"x-float": float64(n) / 3,
			"x-table": amqp091.Table{"k": value},
			"x-list":  []any{value, n},
			"x-bool":  n%2 == 0,
			"x-time":  time.Unix(n%(1<<33), 0),
			"x-nil":   nil,
		}
		if value != "" {
			headers["x-string"] = value
		}
		if key != "" {
			headers[HeaderKey] = key
		}
		if idHeader != "" {
			headers[idem.HeaderEventID] = idHeader
		}
		switch {
		case attempt != "":
			headers[idem.HeaderAttempt] = attempt
		case n != 0:
			headers[idem.HeaderAttempt] = int32(n)
		}
		d := amqp091.Delivery{Body: body, Type: typ, Exchange: exchange, RoutingKey: routingKey, MessageId: messageID, Headers: headers}
		got := toDelivery(d, "stock.events")
		brokertest.CheckDelivery(t, got, body)
		if got.Source != "stock.events" {
			t.Fatalf("source %q", got.Source)
		}
		if key != "" && (string(got.Message.Key) != key || got.Message.Headers[HeaderKey] != "") {
			t.Fatalf("key %q came out as %q, headers %q", key, got.Message.Key, got.Message.Headers)
		}
		if s, ok := headerString(headers[idem.HeaderAttempt]); ok {
			if a, err := strconv.Atoi(s); err == nil && a > 0 && got.Attempt != a {
				t.Fatalf("attempt header %q gave attempt %d", s, got.Attempt)
			}
		}

		// The round trip: an event made of the same inputs, as published.
		ev := idem.Event{
			ID:               uuid.NewSHA1(uuid.NameSpaceOID, body),
			Name:             typ,
			OccurredAt:       time.Unix(n%(1<<35), n%1e9).UTC(),
			AggregateType:    exchange,
			AggregateID:      key,
			AggregateVersion: max(n, 0),
			Payload:          body,
			Headers:          map[string]string{"x-h": value},
		}
		msg, err := idem.NewMessage(ev)
		if err != nil {
			return // not an event a producer can write: nothing to publish
		}
		pub := publishing(msg)
		got = toDelivery(amqp091.Delivery{
			Headers: pub.Headers, ContentType: pub.ContentType, DeliveryMode: pub.DeliveryMode,
			MessageId: pub.MessageId, Type: pub.Type, Body: pub.Body,
			Exchange: "events", RoutingKey: msg.EventName,
		}, "stock.events")
		brokertest.CheckRoundTrip(t, msg, got)
		if got.Attempt != 1 {
			t.Fatalf("a first delivery has attempt %d", got.Attempt)
		}
		for _, mode := range brokertest.CloudEventsModes {
			ce, err := idem.CloudEvents{Mode: mode}.Encode(msg, idem.CloudEventsAMQP)
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			pub := publishing(ce)
			got := toDelivery(amqp091.Delivery{
				Headers: pub.Headers, ContentType: pub.ContentType, DeliveryMode: pub.DeliveryMode,
				MessageId: pub.MessageId, Type: pub.Type, Body: pub.Body,
				Exchange: "events", RoutingKey: ce.EventName,
			}, "stock.events")
			brokertest.CheckCloudEventsRoundTrip(t, mode, msg, got)
		}
	})
}
