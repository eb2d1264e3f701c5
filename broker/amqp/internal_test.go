package amqp

import (
	"strconv"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/internal/keyhash"
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

// TestBucketHeader: every published message carries the bucket of its key
// (also a message without a key), from the hash broker/nats uses for its
// partitions (package keyhash), and the subscriber does not hand the header
// to the consumer.
func TestBucketHeader(t *testing.T) {
	for _, key := range []string{"order-1", "", "a"} {
		pub := publishing(idem.Message{EventName: "e", Key: []byte(key)})
		want := strconv.Itoa(int(keyhash.Sum([]byte(key)) % Buckets))
		if got := pub.Headers[HeaderBucket]; got != want || Bucket([]byte(key)) != int(keyhash.Sum([]byte(key))%Buckets) {
			t.Errorf("key %q: header %s = %v, Bucket = %d; want %s", key, HeaderBucket, got, Bucket([]byte(key)), want)
		}
		d := toDelivery(amqp091.Delivery{Headers: pub.Headers, Type: "e"}, "q")
		if _, ok := d.Message.Headers[HeaderBucket]; ok {
			t.Errorf("key %q: the consumer got the %s header", key, HeaderBucket)
		}
	}
}

// A binary CloudEvent another program published, without idem's key header,
// is ordered by its subject; the key header wins when set. Its content type
// is the message's content-type header unless it is application/json.
func TestCloudEventsOrderKeyAndContentType(t *testing.T) {
	for _, c := range []struct {
		headers amqp091.Table
		want    string
	}{
		{amqp091.Table{"cloudEvents_subject": "42"}, "42"},
		{amqp091.Table{"cloudEvents:subject": "43"}, "43"},
		{amqp091.Table{HeaderKey: "k", "cloudEvents_subject": "42"}, "k"},
		{amqp091.Table{}, ""},
	} {
		if got := orderKey(amqp091.Delivery{Headers: c.headers}); got != c.want {
			t.Errorf("orderKey(%v) = %q, want %q", c.headers, got, c.want)
		}
	}
	d := toDelivery(amqp091.Delivery{ContentType: "application/cloudevents+json", Body: []byte("{}")}, "q")
	if d.Message.Headers[idem.HeaderContentType] != "application/cloudevents+json" {
		t.Errorf("content type not carried: %v", d.Message.Headers)
	}
	d = toDelivery(amqp091.Delivery{ContentType: "application/json", Body: []byte("{}")}, "q")
	if _, ok := d.Message.Headers[idem.HeaderContentType]; ok {
		t.Errorf("application/json carried as a header: %v", d.Message.Headers)
	}
	if p := publishing(idem.Message{Headers: map[string]string{idem.HeaderContentType: "text/plain", "x": "y"}}); p.ContentType != "text/plain" || p.Headers[idem.HeaderContentType] != nil {
		t.Errorf("published content type %q, headers %v", p.ContentType, p.Headers)
	}
}
