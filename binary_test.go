package idem_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// allBytes is a payload with every byte value, 0x00 to 0xff.
func allBytes() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func binaryEvent() idem.Event {
	return idem.Event{
		ID:               idem.NewEventID(),
		Name:             "order.order.placed.v1",
		OccurredAt:       time.Date(2026, 12, 4, 8, 0, 0, 123456000, time.UTC),
		AggregateType:    "order",
		AggregateID:      "42",
		AggregateVersion: 3,
		ContentType:      "application/x-protobuf",
		Payload:          allBytes(),
	}
}

func TestEventContentType(t *testing.T) {
	t.Parallel()
	ev := binaryEvent()
	if err := ev.Validate(); err != nil {
		t.Fatalf("bytes with a content type: %v", err)
	}
	for _, ct := range []string{"", "application/json", "application/json; charset=utf-8", "text/json", "application/vnd.shop+json", "Application/JSON"} {
		ev.ContentType = ct
		if !ev.IsJSON() {
			t.Errorf("%q is not JSON", ct)
		}
		var fe *idem.FieldError
		if err := ev.Validate(); !errors.As(err, &fe) || fe.Field != "payload" {
			t.Errorf("bytes as %q: %v, want a payload error", ct, err)
		}
	}
	for _, ct := range []string{"protobuf", "/x", "a/", "a b/c", "application/x\x00"} {
		ev.ContentType = ct
		var fe *idem.FieldError
		if err := ev.Validate(); !errors.As(err, &fe) || fe.Field != "content_type" {
			t.Errorf("content type %q: %v, want a content_type error", ct, err)
		}
	}
}

func TestEnvelopeBinaryPayload(t *testing.T) {
	t.Parallel()
	ev := binaryEvent()
	b, err := idem.MarshalEnvelope(ev)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatalf("envelope is not JSON: %s", b)
	}
	if !bytes.Contains(b, []byte(`"aggregate_version":3,"content_type":"application/x-protobuf","payload_base64":"AAECAwQF`)) || bytes.Contains(b, []byte(`"payload":`)) {
		t.Fatalf("envelope: %s", b)
	}
	back, err := idem.Decode(idem.Message{Body: b})
	if err != nil {
		t.Fatal(err)
	}
	if back.ContentType != ev.ContentType || !bytes.Equal(back.Payload, ev.Payload) || back.ID != ev.ID || back.AggregateVersion != 3 {
		t.Fatalf("decoded %+v", back)
	}
	// An empty payload is an empty base64 string, and comes back empty.
	ev.Payload = nil
	b, _ = idem.MarshalEnvelope(ev)
	back, err = idem.Decode(idem.Message{Body: b})
	if err != nil || back.Payload == nil || len(back.Payload) != 0 || !strings.Contains(string(b), `"payload_base64":""`) {
		t.Fatalf("empty: %s: %q %v", b, back.Payload, err)
	}
	// A JSON content type keeps "payload", and the type.
	ev.ContentType, ev.Payload = "application/vnd.shop.order+json", json.RawMessage(`{"n": 1}`)
	b, _ = idem.MarshalEnvelope(ev)
	back, err = idem.Decode(idem.Message{Body: b})
	if err != nil || back.ContentType != ev.ContentType || string(back.Payload) != `{"n":1}` {
		t.Fatalf("JSON type: %s: %+v %v", b, back, err)
	}
	// No content type: the envelope of every release before.
	ev.ContentType = ""
	b, _ = idem.MarshalEnvelope(ev)
	if bytes.Contains(b, []byte("content_type")) {
		t.Fatalf("envelope without a content type: %s", b)
	}
}

func TestEnvelopeBinaryPayloadUndecodable(t *testing.T) {
	t.Parallel()
	head := `{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a","aggregate_type":"t","aggregate_id":"1",`
	for name, c := range map[string]struct{ body, want string }{
		"not base64":       {`"content_type":"application/x-protobuf","payload_base64":"***"}`, "payload_base64 is not a base64 string"},
		"both":             {`"content_type":"application/x-protobuf","payload_base64":"","payload":null}`, "one or the other"},
		"JSON type":        {`"content_type":"application/json","payload_base64":"e30="}`, "JSON content type"},
		"bytes, no base64": {`"content_type":"application/x-protobuf","payload":{}}`, "payload_base64 is missing"},
		"bad type":         {`"content_type":"protobuf","payload_base64":""}`, "not a media type"},
	} {
		_, err := idem.Decode(idem.Message{Body: []byte(head + c.body)})
		if !errors.Is(err, idem.ErrUndecodable) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
	ev, err := idem.Decode(idem.Message{Body: []byte(head + `"payload_base64":"AP8="}`)})
	if err != nil || ev.ContentType != idem.ContentTypeOctetStream || string(ev.Payload) != "\x00\xff" {
		t.Errorf("no content type: %+v %v", ev, err)
	}
}

func TestCloudEventsBinaryPayload(t *testing.T) {
	t.Parallel()
	ev := binaryEvent()
	for _, b := range []idem.CloudEventsBinding{idem.CloudEventsKafka, idem.CloudEventsAMQP, idem.CloudEventsNATS} {
		out, err := idem.CloudEvents{}.EncodeEvent(ev, b)
		if err != nil {
			t.Fatal(err)
		}
		ct := out.Headers[b.ContentTypeHeader]
		if b.DataContentTypeAsAttribute {
			ct = out.Headers[b.Prefix+"datacontenttype"]
		}
		if !bytes.Equal(out.Body, allBytes()) || ct != "application/x-protobuf" {
			t.Errorf("%s binary: body %q, content type %q", b.Name, out.Body, ct)
		}
		out, err = idem.CloudEvents{Mode: idem.CloudEventsStructured}.EncodeEvent(ev, b)
		if err != nil {
			t.Fatal(err)
		}
		var fields map[string]any
		if err := json.Unmarshal(out.Body, &fields); err != nil || fields["datacontenttype"] != "application/x-protobuf" ||
			fields["data"] != nil || !strings.HasPrefix(fields["data_base64"].(string), "AAECAwQF") {
			t.Errorf("%s structured: %s %v", b.Name, out.Body, err)
		}
		for _, mode := range []idem.CloudEventsMode{idem.CloudEventsBinary, idem.CloudEventsStructured} {
			out, _ := idem.CloudEvents{Mode: mode}.EncodeEvent(ev, b)
			back, err := idem.Decode(out)
			if err != nil || back.ContentType != ev.ContentType || !bytes.Equal(back.Payload, ev.Payload) || back.ID != ev.ID {
				t.Errorf("%s %s: %+v %v", b.Name, mode, back, err)
			}
			// An envelope with a binary payload becomes the same CloudEvent.
			msg, err := idem.NewMessage(ev)
			if err != nil {
				t.Fatal(err)
			}
			again, err := idem.CloudEvents{Mode: mode}.Encode(msg, b)
			if err != nil || !bytes.Equal(again.Body, out.Body) {
				t.Errorf("%s %s from the envelope: %q %v", b.Name, mode, again.Body, err)
			}
		}
	}
}
