package idem_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
)

// An event published as a binary CloudEvent on Kafka: the payload is the
// record's value, the attributes are its ce_ headers. A publisher does
// this when its configuration has CloudEvents set
// (kafka.PublisherConfig{CloudEvents: &idem.CloudEvents{}}).
func ExampleCloudEvents_EncodeEvent() {
	ev := idem.Event{
		ID:               uuid.MustParse("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
		Name:             "order.order.placed.v1",
		OccurredAt:       time.Date(2026, 12, 2, 8, 0, 0, 123456000, time.UTC),
		AggregateType:    "order",
		AggregateID:      "42",
		AggregateVersion: 3,
		Payload:          json.RawMessage(`{"total": "12.50"}`),
	}
	msg, err := idem.CloudEvents{Source: "/shop/order"}.EncodeEvent(ev, idem.CloudEventsKafka)
	if err != nil {
		panic(err)
	}
	keys := make([]string, 0, len(msg.Headers))
	for k := range msg.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Printf("%s: %s\n", k, msg.Headers[k])
	}
	fmt.Printf("key: %s\nvalue: %s\n", msg.Key, msg.Body)

	structured, _ := idem.CloudEvents{Mode: idem.CloudEventsStructured, Source: "/shop/order"}.EncodeEvent(ev, idem.CloudEventsKafka)
	fmt.Printf("structured: %s\n", structured.Body)
	// Output:
	// ce_aggregatetype: order
	// ce_aggregateversion: 3
	// ce_id: 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b
	// ce_source: /shop/order
	// ce_specversion: 1.0
	// ce_subject: 42
	// ce_time: 2026-12-02T08:00:00.123456Z
	// ce_type: order.order.placed.v1
	// content-type: application/json
	// key: 42
	// value: {"total":"12.50"}
	// structured: {"specversion":"1.0","id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","source":"/shop/order","type":"order.order.placed.v1","time":"2026-12-02T08:00:00.123456Z","subject":"42","datacontenttype":"application/json","aggregatetype":"order","aggregateversion":3,"data":{"total":"12.50"}}
}

// A binary CloudEvent that a program knowing nothing of idem published on
// NATS, with an id that is not a UUID: the event id is derived from it as
// idem.EventID does, and the id as sent is kept.
func ExampleDecoder_cloudEvents() {
	msg := idem.Message{
		Headers: map[string]string{
			"ce-specversion": "1.0",
			"ce-id":          "order-17",
			"ce-source":      "https://billing.example.com",
			"ce-type":        "com.example.invoice.paid",
			"ce-subject":     "invoice%2042",
			"ce-time":        "2026-12-02T09:00:00+01:00",
		},
		Body: []byte(`{"amount":"12.50"}`),
	}
	ev, err := idem.Decode(msg)
	if err != nil {
		panic(err)
	}
	fmt.Println(ev.ID, ev.Headers[idem.HeaderOriginalID])
	fmt.Println(ev.Name, ev.AggregateID, ev.OccurredAt.Format(time.RFC3339), string(ev.Payload))
	fmt.Println(ev.Headers["ce_source"])

	delete(msg.Headers, "ce-source")
	_, err = idem.Decode(msg)
	fmt.Println(err)
	// Output:
	// babb0a4e-9813-5298-a9ef-cb6986a66c5c order-17
	// com.example.invoice.paid invoice 42 2026-12-02T08:00:00Z {"amount":"12.50"}
	// https://billing.example.com
	// idem: undecodable message: source is missing: a CloudEvent has specversion, id, source and type
}
