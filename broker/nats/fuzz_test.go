package nats

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
)

// fuzzMsg is a received JetStream message: what toDelivery reads of one.
// The other methods of jetstream.Msg are not implemented (nil).
type fuzzMsg struct {
	jetstream.Msg
	data      []byte
	headers   nats.Header
	subject   string
	delivered uint64
}

func (m *fuzzMsg) Data() []byte         { return m.data }
func (m *fuzzMsg) Headers() nats.Header { return m.headers }
func (m *fuzzMsg) Subject() string      { return m.subject }

func (m *fuzzMsg) Metadata() (*jetstream.MsgMetadata, error) {
	if m.delivered == 0 {
		return nil, errors.New("no metadata")
	}
	return &jetstream.MsgMetadata{NumDelivered: m.delivered}, nil
}

// FuzzToDelivery feeds Subscriber.toDelivery JetStream messages with any
// data, subject and headers (empty ones too): it must not panic, must keep
// the data as received, and what it produces must decode or be rejected with
// idem.ErrUndecodable, so that the consumer parks it. The same inputs also
// make an event, published as the Publisher does, as an envelope and as a
// CloudEvent in both modes: the consumer must get it back as the envelope
// says.
func FuzzToDelivery(f *testing.F) {
	id := "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	f.Add([]byte(brokertest.FuzzEnvelope), "events.order.order.placed.v1", id, "", "order.order.placed.v1", "42", "order", "x-h", "v", uint32(1))
	f.Add([]byte(`{"orderId":42}`), "events-retry.stock.OrderCreated", id+".retry.x", id, "OrderCreated", `"42"`, "", "", "", uint32(3))
	f.Add([]byte(`"{\"orderId\":42}"`), "other.subject", "", "not-a-uuid", "", "", "", "id", id, uint32(0))
	f.Add([]byte("\xff\xfe"), "\x00", "\xff", "\x00", "\xff", "\xff", "\x00", "\xff", "", uint32(1<<31))
	f.Add([]byte(`[]`), "events.", "", "", "", "", "", "", "", uint32(7))
	f.Fuzz(func(t *testing.T, data []byte, subject, msgID, id, eventType, key, aggType, hk, hv string, delivered uint32) {
		s := &Subscriber{cfg: SubscriberConfig{Consumer: "stock"}.WithDefaults()}
		h := nats.Header{"X-Empty": nil}
		for _, kv := range [][2]string{
			{jetstream.MsgIDHeader, msgID}, {idem.HeaderEventID, id}, {idem.HeaderEventType, eventType},
			{HeaderKey, key}, {HeaderAggregateType, aggType}, {hk, hv},
		} {
			if kv[0] != "" && kv[1] != "" {
				h[kv[0]] = append(h[kv[0]], kv[1])
			}
		}
		got := s.toDelivery(&fuzzMsg{data: data, headers: h, subject: subject, delivered: uint64(delivered)})
		brokertest.CheckDelivery(t, got, data)
		if got.Source != "stock" {
			t.Fatalf("source %q", got.Source)
		}
		if delivered > 0 && got.Attempt != int(delivered) {
			t.Fatalf("delivered %d times, attempt %d", delivered, got.Attempt)
		}
		if _, ok := got.Message.Headers[jetstream.MsgIDHeader]; ok {
			t.Fatalf("%s kept in the headers", jetstream.MsgIDHeader)
		}

		// The round trip: an event made of the same inputs, as published.
		ev := idem.Event{
			ID:               uuid.NewSHA1(uuid.NameSpaceOID, data),
			Name:             eventType,
			OccurredAt:       time.Unix(int64(delivered), int64(delivered)%1e9).UTC(),
			AggregateType:    aggType,
			AggregateID:      key,
			AggregateVersion: int64(delivered),
			Payload:          data,
			Headers:          map[string]string{"x-h": hv},
		}
		msg, err := idem.NewMessage(ev)
		if err != nil {
			return // not an event a producer can write: nothing to publish
		}
		subj, err := s.cfg.Stream.Subject(msg.EventName)
		if err != nil {
			return // a name that makes no subject: the publisher refuses it
		}
		out := natsMsg(subj, msg, msg.EventID.String())
		got = s.toDelivery(&fuzzMsg{data: out.Data, headers: out.Header, subject: out.Subject, delivered: 1})
		brokertest.CheckRoundTrip(t, msg, got)
		if got.Message.AggregateType != msg.AggregateType || got.Message.EventName != msg.EventName {
			t.Fatalf("published %q %q, received %q %q", msg.AggregateType, msg.EventName, got.Message.AggregateType, got.Message.EventName)
		}
		for _, mode := range brokertest.CloudEventsModes {
			ce, err := idem.CloudEvents{Mode: mode}.Encode(msg, idem.CloudEventsNATS)
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			out := natsMsg(subj, ce, ce.EventID.String())
			got := s.toDelivery(&fuzzMsg{data: out.Data, headers: out.Header, subject: out.Subject, delivered: 1})
			brokertest.CheckCloudEventsRoundTrip(t, mode, msg, got)
		}
	})
}
