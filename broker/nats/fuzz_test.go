package nats

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
)

const fuzzEnvelope = `{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"order.order.placed.v1","occurred_at":"2026-12-02T08:00:00.123456Z","aggregate_type":"order","aggregate_id":"42","aggregate_version":3,"payload":{"orderId":"42"}}`

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
// make an event, published as the Publisher does: the consumer must get it
// back as the envelope says.
func FuzzToDelivery(f *testing.F) {
	id := "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	f.Add([]byte(fuzzEnvelope), "events.order.order.placed.v1", id, "", "order.order.placed.v1", "42", "order", "x-h", "v", uint32(1))
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
		checkDelivery(t, got, data)
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
		checkRoundTrip(t, msg, got)
		if got.Message.AggregateType != msg.AggregateType || got.Message.EventName != msg.EventName {
			t.Fatalf("published %q %q, received %q %q", msg.AggregateType, msg.EventName, got.Message.AggregateType, got.Message.EventName)
		}
	})
}

// checkDelivery checks what every conversion must give: the data as
// received, an attempt of at least 1, and a message that decodes or is
// undecodable.
func checkDelivery(t *testing.T, d inbox.Delivery, data []byte) {
	t.Helper()
	if !bytes.Equal(d.Message.Body, data) {
		t.Fatalf("data %q came out as %q", data, d.Message.Body)
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

// checkRoundTrip checks that the delivery of a published msg decodes to the
// event its envelope holds, with the message's headers.
func checkRoundTrip(t *testing.T, msg idem.Message, d inbox.Delivery) {
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
}
