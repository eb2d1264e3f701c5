package amqp

import (
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
)

func TestDelayBucket(t *testing.T) {
	for _, tc := range []struct{ in, want time.Duration }{
		{0, time.Millisecond},
		{time.Millisecond, time.Millisecond},
		{1500 * time.Microsecond, 2 * time.Millisecond},
		{20 * time.Millisecond, 20 * time.Millisecond},
		{time.Second, time.Second},
		{1043 * time.Millisecond, 1250 * time.Millisecond},
		{900 * time.Millisecond, time.Second},
		{2 * time.Second, 2 * time.Second},
		{4100 * time.Millisecond, 5 * time.Second},
		{9 * time.Second, 10 * time.Second},
		{time.Minute, 63 * time.Second},
	} {
		if got := delayBucket(tc.in); got != tc.want {
			t.Errorf("delayBucket(%v) = %v, want %v", tc.in, got, tc.want)
		}
		if got := delayBucket(tc.in); got < tc.in {
			t.Errorf("delayBucket(%v) = %v is shorter than the delay", tc.in, got)
		}
	}
	if got := delayQueueName("stock.events", 1250*time.Millisecond); got != "stock.events.retry.1250ms" {
		t.Errorf("delayQueueName = %q", got)
	}
}

func TestToDeliveryAndRetryCopy(t *testing.T) {
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
	c := retryCopy(d, 3, 1500*time.Millisecond)
	if c.Headers[idem.HeaderAttempt] != int32(3) || c.Headers["trace"] != "abc" || c.Headers[HeaderKey] != "42" {
		t.Errorf("retry copy headers %v", c.Headers)
	}
	if _, ok := c.Headers["x-death"]; ok {
		t.Error("retry copy keeps x-death")
	}
	if c.MessageId != d.MessageId || c.Type != d.Type || string(c.Body) != string(d.Body) ||
		c.DeliveryMode != amqp091.Persistent || c.Expiration != "1500" || c.UserId != "" {
		t.Errorf("retry copy %+v", c)
	}
}
