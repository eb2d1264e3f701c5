package kafka

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
)

// FuzzDelivery feeds Subscriber.delivery Kafka records with any value, key,
// topic and headers (repeated ones too): it must not panic, must keep the
// value and key as received, and what it produces must decode or be rejected
// with idem.ErrUndecodable, so that the consumer parks it. The same inputs
// also make an event, produced as the Publisher does in both value formats
// and as a CloudEvent in both modes: an envelope or a CloudEvent must come
// back as it was sent, a Debezium-style record must decode or be
// undecodable.
func FuzzDelivery(f *testing.F) {
	id := "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	f.Add([]byte(brokertest.FuzzEnvelope), []byte("42"), "outbox.event.order", id, "order.order.placed.v1", "x-h", "v", int32(0), uint8(0))
	f.Add([]byte(`{"orderId":42}`), []byte(`"42"`), "outbox.event.order", id, "", "", "", int32(3), uint8(2))
	f.Add([]byte(`"{\"orderId\":42}"`), []byte(`{"schema":{},"payload":"42"}`), "legacy", id, "OrderCreated", "id", "not-a-uuid", int32(-1), uint8(9))
	f.Add([]byte(`{"schema":{},"payload":"\"x\""}`), []byte{}, "outbox.event.", "", "", "eventType", "", int32(1), uint8(255))
	f.Add([]byte("\xff\xfe"), []byte("\xff"), "\x00", "\x00", "\xff", "\xff", "\x00", int32(7), uint8(1))
	f.Fuzz(func(t *testing.T, value, key []byte, topic, id, eventType, hk, hv string, partition int32, attempt uint8) {
		s := &Subscriber{cfg: SubscriberConfig{
			DefaultEventNames: map[string]string{"legacy": "OrderCreated", "outbox.event.order": "order.order.placed.v1"},
		}.WithDefaults()}
		var headers []kgo.RecordHeader
		if id != "" {
			headers = append(headers, kgo.RecordHeader{Key: idem.HeaderEventID, Value: []byte(id)})
		}
		if eventType != "" {
			headers = append(headers, kgo.RecordHeader{Key: idem.HeaderEventType, Value: []byte(eventType)})
		}
		if hk != "" {
			headers = append(headers, kgo.RecordHeader{Key: hk, Value: []byte(hv)})
		}
		r := &kgo.Record{Topic: topic, Partition: partition, Key: key, Value: value, Headers: headers}
		got := s.delivery(r, int(attempt)+1)
		brokertest.CheckDelivery(t, got, value)
		if !bytes.Equal(got.Message.Key, key) {
			t.Fatalf("key %q came out as %q", key, got.Message.Key)
		}
		if want := topic + "/" + strconv.Itoa(int(partition)); got.Source != want {
			t.Fatalf("source %q, want %q", got.Source, want)
		}
		if got.Attempt != int(attempt)+1 {
			t.Fatalf("attempt %d, want %d", got.Attempt, int(attempt)+1)
		}

		// The round trip: an event made of the same inputs, as produced.
		ev := idem.Event{
			ID:               uuid.NewSHA1(uuid.NameSpaceOID, value),
			Name:             eventType,
			OccurredAt:       time.Unix(int64(partition), int64(attempt)*1e6).UTC(),
			AggregateType:    hv,
			AggregateID:      string(key),
			AggregateVersion: int64(max(partition, 0)),
			Payload:          value,
			Headers:          map[string]string{"x-h": hk},
		}
		msg, err := idem.NewMessage(ev)
		if err != nil {
			return // not an event a producer can write: nothing to produce
		}
		for _, mode := range brokertest.CloudEventsModes {
			p := &Publisher{cfg: PublisherConfig{CloudEvents: &idem.CloudEvents{Mode: mode}}.WithDefaults()}
			rec, err := p.record(msg)
			if err != nil {
				continue // an aggregate type that makes no topic name: refused
			}
			brokertest.CheckCloudEventsRoundTrip(t, mode, msg, s.delivery(rec, 1))
		}
		for _, format := range []ValueFormat{Envelope, DebeziumPayload} {
			p := &Publisher{cfg: PublisherConfig{ValueFormat: format}.WithDefaults()}
			rec, err := p.record(msg)
			if err != nil {
				continue // an aggregate type that makes no topic name: refused
			}
			got := s.delivery(rec, 1)
			if format == Envelope {
				brokertest.CheckRoundTrip(t, msg, got)
				continue
			}
			brokertest.CheckDelivery(t, got, rec.Value)
			// A bare payload that is a whole envelope (event_id,
			// event_name and payload) reads as that envelope.
			var fields map[string]json.RawMessage
			if json.Unmarshal(rec.Value, &fields) == nil && fields["event_id"] != nil && fields["event_name"] != nil && fields["payload"] != nil {
				continue
			}
			dec, err := idem.Decode(got.Message)
			if err != nil {
				t.Fatalf("Debezium-style record of %+v: %v", ev, err)
			}
			if dec.ID != ev.ID || dec.Name != ev.Name || dec.AggregateType != ev.AggregateType {
				t.Fatalf("Debezium-style record of %+v decoded as %+v", ev, dec)
			}
		}
	})
}
