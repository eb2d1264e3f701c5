package amqp

import (
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
)

func TestToDelivery(t *testing.T) {
	d := amqp091.Delivery{
		MessageId:   "01938f4e-6f6a-7cc4-a9a4-5a3c7a0a0b01",
		Type:        "order.order.placed.v1",
		Exchange:    "events",
		RoutingKey:  "order.order.placed.v1",
		ContentType: "application/json",
		UserId:      "guest",
		Redelivered: true,
		Headers: amqp091.Table{
			HeaderKey:          "42",
			idem.HeaderAttempt: int32(2),
			"trace":            "abc",
			"x-death":          []any{amqp091.Table{"count": int64(1)}},
		},
		Body: []byte(`{"event_id":"01938f4e-6f6a-7cc4-a9a4-5a3c7a0a0b01"}`),
	}
	got := toDelivery(d, "stock.events")
	if got.Attempt != 2 || got.Source != "stock.events" || string(got.Message.Key) != "42" ||
		got.Message.EventID.String() != d.MessageId || got.Message.EventName != d.Type ||
		got.Message.Headers["trace"] != "abc" || got.Message.Headers[idem.HeaderAttempt] != "2" {
		t.Fatalf("toDelivery = %+v", got)
	}
	if _, ok := got.Message.Headers["x-death"]; ok {
		t.Error("x-death kept as a string header")
	}
	if _, ok := got.Message.Headers[HeaderKey]; ok {
		t.Error("key header not moved to Message.Key")
	}
}
