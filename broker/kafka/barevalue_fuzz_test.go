package kafka

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
)

// FuzzBareValue feeds bareValue, which takes the payload out of an outbox
// row's body for the Debezium-style value format, any body: it must not
// panic; it returns the body itself, or, for an envelope, its payload, a
// valid JSON value found in the body; and the payload of an envelope idem
// wrote comes out as it went in.
func FuzzBareValue(f *testing.F) {
	f.Add([]byte(brokertest.FuzzEnvelope))
	f.Add([]byte(`{"event_id":null,"payload":1}`))
	f.Add([]byte(`{"event_id":"x","payload":null}`))
	f.Add([]byte(`  {"event_id":"x","payload":{"a":[1,2]}}  `))
	f.Add([]byte(`{"orderId":42}`))
	f.Add([]byte(`"{\"event_id\":\"x\"}"`))
	f.Add([]byte("\xff{"))
	f.Fuzz(func(t *testing.T, body []byte) {
		got := bareValue(body)
		if !bytes.Equal(got, body) {
			if !json.Valid(got) || !bytes.Contains(body, bytes.TrimSpace(got)) {
				t.Fatalf("bareValue(%q) = %q: neither the body nor a JSON value of it", body, got)
			}
		}
		var payload any
		if json.Unmarshal(body, &payload) != nil {
			return
		}
		ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", payload)
		if err != nil {
			return
		}
		env, err := idem.MarshalEnvelope(ev)
		if err != nil {
			t.Fatal(err)
		}
		if got := bareValue(env); !bytes.Equal(got, ev.Payload) {
			t.Fatalf("bareValue of an envelope of %s = %s, want the payload %s", body, got, ev.Payload)
		}
	})
}
