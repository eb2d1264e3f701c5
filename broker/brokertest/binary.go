package brokertest

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/testsvc"
)

// ContentTypeProtobuf is the content type of BinaryPayloadMessage.
const ContentTypeProtobuf = "application/x-protobuf"

// AllBytes returns a payload with every byte value, 0x00 to 0xff.
func AllBytes() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// BinaryPayloadMessage returns an envelope message of aggregate type "test"
// (as NewMessage) whose payload is AllBytes, of content type
// ContentTypeProtobuf: what a relay publishes for such an event.
func BinaryPayloadMessage(t testing.TB, name, key string) idem.Message {
	t.Helper()
	m, err := idem.NewMessage(idem.Event{ID: idem.NewEventID(), Name: name, OccurredAt: time.Now().UTC(),
		AggregateType: "test", AggregateID: key, ContentType: ContentTypeProtobuf, Payload: AllBytes()})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Received collects the messages a subscriber delivers, acknowledging
// each: its Deliver is a broker.DeliverFunc.
type Received struct {
	mu   sync.Mutex
	msgs []idem.Message
}

// Deliver implements broker.DeliverFunc.
func (r *Received) Deliver(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]broker.Disposition, len(ds))
	for i, d := range ds {
		r.msgs = append(r.msgs, d.Message)
		out[i] = broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
	}
	return out, make([]error, len(ds))
}

// Wait returns the first message received with event id id, waiting up to
// 30 seconds for it.
func (r *Received) Wait(t testing.TB, id uuid.UUID) idem.Message {
	t.Helper()
	var got idem.Message
	testsvc.WaitFor(t, 30*time.Second, "the message received", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, m := range r.msgs {
			if m.EventID == id {
				got = m
				return true
			}
		}
		return false
	})
	return got
}

// CheckBinaryPayload checks that got, a message received for sent (a
// BinaryPayloadMessage), decodes to an event with sent's content type and
// exactly its bytes.
func CheckBinaryPayload(t testing.TB, sent, got idem.Message) {
	t.Helper()
	ev, err := idem.Decode(got)
	if err != nil {
		t.Fatalf("decode the received message: %v", err)
	}
	if ev.ID != sent.EventID || ev.ContentType != ContentTypeProtobuf || !bytes.Equal(ev.Payload, AllBytes()) {
		t.Errorf("received event %s, content type %q, payload %x; want %s, %q and every byte value",
			ev.ID, ev.ContentType, ev.Payload, sent.EventID, ContentTypeProtobuf)
	}
}
