package brokertest

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// The checks of this file are for each transport's fuzz test of its
// conversion of a received message to a broker.Delivery.

// FuzzEnvelope is an envelope, a seed for the fuzz tests.
const FuzzEnvelope = `{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"order.order.placed.v1","occurred_at":"2026-12-02T08:00:00.123456Z","aggregate_type":"order","aggregate_id":"42","aggregate_version":3,"payload":{"orderId":"42"}}`

// CheckDelivery checks what every conversion must give, whatever was
// received: the body as received, an attempt of at least 1, and a message
// that decodes or is undecodable (idem.ErrUndecodable), so that the
// consumer parks it.
func CheckDelivery(t *testing.T, d broker.Delivery, body []byte) {
	t.Helper()
	if !bytes.Equal(d.Message.Body, body) {
		t.Fatalf("body %q came out as %q", body, d.Message.Body)
	}
	if d.Attempt < 1 {
		t.Fatalf("attempt %d", d.Attempt)
	}
	ev, err := idem.Decode(d.Message)
	if err != nil {
		if !errors.Is(err, idem.ErrUndecodable) {
			t.Fatalf("decode error %v is not idem.ErrUndecodable", err)
		}
		return
	}
	if ev.ID == uuid.Nil || ev.Name == "" {
		t.Fatalf("decoded an event without id or name: %+v", ev)
	}
}

// CheckRoundTrip checks that the delivery d of msg, published as the
// transport's publisher does, decodes to the event its envelope holds, with
// the message's id, key and headers.
func CheckRoundTrip(t *testing.T, msg idem.Message, d broker.Delivery) {
	t.Helper()
	want, err := idem.Decode(idem.Message{Body: msg.Body})
	if err != nil {
		t.Fatalf("the envelope %s does not decode: %v", msg.Body, err)
	}
	got, err := idem.Decode(d.Message)
	if err != nil {
		t.Fatalf("published %+v, received %+v: %v", msg, d.Message, err)
	}
	if got.ID != want.ID || got.Name != want.Name || !got.OccurredAt.Equal(want.OccurredAt) ||
		got.AggregateType != want.AggregateType || got.AggregateID != want.AggregateID ||
		got.AggregateVersion != want.AggregateVersion || !bytes.Equal(got.Payload, want.Payload) {
		t.Fatalf("received\n%+v\nwant\n%+v", got, want)
	}
	for k, v := range msg.Headers {
		if got.Headers[k] != v {
			t.Fatalf("header %q: received %q, want %q", k, got.Headers[k], v)
		}
	}
	if d.Message.EventID != msg.EventID || !bytes.Equal(d.Message.Key, msg.Key) {
		t.Fatalf("id %s key %q received as %s %q", msg.EventID, msg.Key, d.Message.EventID, d.Message.Key)
	}
	if !json.Valid(got.Payload) {
		t.Fatalf("payload %q is not JSON", got.Payload)
	}
}

// CloudEventsModes are the content modes the fuzz tests publish in.
var CloudEventsModes = []idem.CloudEventsMode{idem.CloudEventsBinary, idem.CloudEventsStructured}

// CheckCloudEventsRoundTrip checks that the delivery d of msg, published as
// a CloudEvent as the transport's publisher does with
// PublisherConfig.CloudEvents set, decodes to the event msg's envelope
// holds, with the message's headers.
func CheckCloudEventsRoundTrip(t *testing.T, mode idem.CloudEventsMode, msg idem.Message, d broker.Delivery) {
	t.Helper()
	want, err := idem.Decode(idem.Message{Body: msg.Body})
	if err != nil {
		t.Fatalf("the envelope %s does not decode: %v", msg.Body, err)
	}
	got, err := idem.Decode(d.Message)
	if err != nil {
		t.Fatalf("%s: published %+v, received %+v: %v", mode, msg, d.Message, err)
	}
	if got.ID != want.ID || got.Name != want.Name || !got.OccurredAt.Equal(want.OccurredAt) ||
		got.AggregateType != want.AggregateType || got.AggregateID != want.AggregateID ||
		got.AggregateVersion != want.AggregateVersion || !bytes.Equal(got.Payload, want.Payload) {
		t.Fatalf("%s: received\n%+v\nwant\n%+v", mode, got, want)
	}
	for k, v := range msg.Headers {
		if got.Headers[k] != v {
			t.Fatalf("%s: header %q: received %q, want %q", mode, k, got.Headers[k], v)
		}
	}
}
