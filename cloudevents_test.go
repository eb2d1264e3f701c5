package idem_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
)

var bindings = map[string]idem.CloudEventsBinding{
	"kafka": idem.CloudEventsKafka,
	"amqp":  idem.CloudEventsAMQP,
	"nats":  idem.CloudEventsNATS,
}

// tracedEvent is the golden event with trace headers, a derived id's
// original and a header of the application's.
func tracedEvent() idem.Event {
	ev := goldenEvent()
	ev.Headers = map[string]string{
		"traceparent":         "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":          "vendor=x",
		idem.HeaderOriginalID: "E42",
		"tenant":              "acme",
	}
	return ev
}

func compact(t testing.TB, raw []byte) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatalf("compact %q: %v", raw, err)
	}
	return b.String()
}

func TestCloudEventsRoundTrip(t *testing.T) {
	t.Parallel()
	for name, b := range bindings {
		for _, mode := range []idem.CloudEventsMode{idem.CloudEventsBinary, idem.CloudEventsStructured} {
			in := tracedEvent()
			msg, err := idem.CloudEvents{Mode: mode}.EncodeEvent(in, b)
			if err != nil {
				t.Fatalf("%s %s: %v", name, mode, err)
			}
			ev, err := idem.Decode(msg)
			if err != nil {
				t.Fatalf("%s %s: decode %s (headers %v): %v", name, mode, msg.Body, msg.Headers, err)
			}
			if ev.ID != in.ID || ev.Name != in.Name || !ev.OccurredAt.Equal(in.OccurredAt.Truncate(time.Microsecond)) ||
				ev.AggregateType != in.AggregateType || ev.AggregateID != in.AggregateID || ev.AggregateVersion != in.AggregateVersion {
				t.Errorf("%s %s: decoded %+v, want %+v", name, mode, ev, in)
			}
			if got, want := compact(t, ev.Payload), compact(t, in.Payload); got != want {
				t.Errorf("%s %s: payload %s, want %s", name, mode, got, want)
			}
			for k, v := range in.Headers {
				if ev.Headers[k] != v {
					t.Errorf("%s %s: header %s = %q, want %q (headers %v)", name, mode, k, ev.Headers[k], v, ev.Headers)
				}
			}
			if ev.Headers["ce_source"] != "/idem/order" || ev.Headers["ce_specversion"] != "1.0" || ev.Headers["ce_traceparent"] != in.Headers["traceparent"] {
				t.Errorf("%s %s: attribute headers %v", name, mode, ev.Headers)
			}
			// Encoding the received message again gives the same message.
			again, err := idem.CloudEvents{Mode: mode}.Encode(msg, b)
			if err != nil || !bytes.Equal(again.Body, msg.Body) || len(again.Headers) != len(msg.Headers) {
				t.Errorf("%s %s: re-encoded %s %v (%v), want %s %v", name, mode, again.Body, again.Headers, err, msg.Body, msg.Headers)
			}
		}
	}
}

func TestCloudEventsBinaryHeaders(t *testing.T) {
	t.Parallel()
	ev := tracedEvent()
	ev.AggregateID = "a b%é"
	want := map[string]string{
		"specversion":      "1.0",
		"id":               "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
		"source":           "/idem/order",
		"type":             "order.order.placed.v1",
		"time":             "2026-12-02T08:00:00.123456Z",
		"subject":          "a b%é",
		"aggregatetype":    "order",
		"aggregateversion": "3",
		"traceparent":      ev.Headers["traceparent"],
		"tracestate":       "vendor=x",
	}
	for name, b := range bindings {
		msg, err := idem.CloudEvents{}.EncodeEvent(ev, b)
		if err != nil {
			t.Fatal(err)
		}
		for attr, v := range want {
			got := msg.Headers[b.Prefix+attr]
			if name == "nats" && attr == "subject" {
				v = "a%20b%25%C3%A9"
			}
			if got != v {
				t.Errorf("%s: header %s%s = %q, want %q", name, b.Prefix, attr, got, v)
			}
		}
		if name == "nats" {
			if msg.Headers["ce-datacontenttype"] != "application/json" || msg.Headers["Content-Type"] != "" {
				t.Errorf("nats: datacontenttype as ce-datacontenttype only: %v", msg.Headers)
			}
		} else if msg.Headers["content-type"] != "application/json" || msg.Headers[b.Prefix+"datacontenttype"] != "" {
			t.Errorf("%s: datacontenttype in content-type only: %v", name, msg.Headers)
		}
		if msg.Headers[idem.HeaderOriginalID] != "E42" || msg.Headers["traceparent"] == "" || msg.Headers["tenant"] != "acme" {
			t.Errorf("%s: idem's headers not carried as they are: %v", name, msg.Headers)
		}
		if got, want := string(msg.Body), compact(t, ev.Payload); got != want {
			t.Errorf("%s: body %s, want the payload %s", name, got, want)
		}
		if msg.EventID != ev.ID || msg.EventName != ev.Name || string(msg.Key) != ev.AggregateID || msg.AggregateType != "order" {
			t.Errorf("%s: transport fields %+v", name, msg)
		}
	}
}

func TestCloudEventsStructuredBody(t *testing.T) {
	t.Parallel()
	ev := goldenEvent()
	msg, err := idem.CloudEvents{Mode: idem.CloudEventsStructured, Source: "https://shop.example.com/order"}.EncodeEvent(ev, idem.CloudEventsKafka)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"specversion":"1.0","id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","source":"https://shop.example.com/order",` +
		`"type":"order.order.placed.v1","time":"2026-12-02T08:00:00.123456Z","subject":"42","datacontenttype":"application/json",` +
		`"aggregatetype":"order","aggregateversion":3,"data":{"orderId":"42","lines":[{"productId":"p-1","quantity":"2.000"}]}}`
	if string(msg.Body) != want {
		t.Errorf("body\n%s\nwant\n%s", msg.Body, want)
	}
	if !json.Valid(msg.Body) {
		t.Error("body is not JSON")
	}
	if len(msg.Headers) != 1 || msg.Headers["content-type"] != idem.ContentTypeCloudEventsJSON {
		t.Errorf("headers %v, want the content type only", msg.Headers)
	}
	nats, _ := idem.CloudEvents{Mode: idem.CloudEventsStructured}.EncodeEvent(ev, idem.CloudEventsNATS)
	if nats.Headers["Content-Type"] != idem.ContentTypeCloudEventsJSON {
		t.Errorf("nats headers %v", nats.Headers)
	}
}

// binary returns a Kafka binary CloudEvent with attrs and data.
func binary(attrs map[string]string, data string) idem.Message {
	h := map[string]string{}
	for k, v := range attrs {
		h["ce_"+k] = v
	}
	return idem.Message{Headers: h, Body: []byte(data)}
}

func minimal() map[string]string {
	return map[string]string{"specversion": "1.0", "id": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "source": "/third/party", "type": "com.example.thing.created"}
}

func structured(attrs map[string]any, data string) idem.Message {
	obj := map[string]json.RawMessage{}
	for k, v := range attrs {
		raw, _ := json.Marshal(v)
		obj[k] = raw
	}
	if data != "" {
		obj["data"] = json.RawMessage(data)
	}
	body, _ := json.Marshal(obj)
	return idem.Message{Headers: map[string]string{"Content-Type": "application/cloudevents+json; charset=utf-8"}, Body: body}
}

func wantUndecodable(t *testing.T, what string, msg idem.Message, mention ...string) {
	t.Helper()
	_, err := idem.Decode(msg)
	if !errors.Is(err, idem.ErrUndecodable) {
		t.Errorf("%s: Decode = %v, want ErrUndecodable", what, err)
		return
	}
	for _, m := range mention {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("%s: error %q does not mention %q", what, err, m)
		}
	}
}

func TestCloudEventsRequiredAttributes(t *testing.T) {
	t.Parallel()
	for _, attr := range []string{"specversion", "id", "source", "type"} {
		attrs := minimal()
		delete(attrs, attr)
		wantUndecodable(t, "binary without "+attr, binary(attrs, `{}`), attr+" is missing")
		sattrs := map[string]any{}
		for k, v := range minimal() {
			if k != attr {
				sattrs[k] = v
			}
		}
		wantUndecodable(t, "structured without "+attr, structured(sattrs, `{}`), attr+" is missing")
		attrs = minimal()
		attrs[attr] = ""
		if attr != "specversion" { // an empty specversion header is no CloudEvent
			wantUndecodable(t, "binary with an empty "+attr, binary(attrs, `{}`), attr+" is missing")
		}
	}
	attrs := minimal()
	attrs["specversion"] = "0.3"
	wantUndecodable(t, "specversion 0.3", binary(attrs, `{}`), "specversion", "0.3")
	wantUndecodable(t, "a number as id", structured(map[string]any{"specversion": "1.0", "id": 42, "source": "/s", "type": "t"}, `{}`), "id is not a string")
	attrs = minimal()
	attrs["source"] = "not a uri"
	wantUndecodable(t, "a source with spaces", binary(attrs, `{}`), "source")
	attrs = minimal()
	attrs["aggregateversion"] = "-1"
	wantUndecodable(t, "a negative version", binary(attrs, `{}`), "aggregateversion")
	wantUndecodable(t, "the avro format", idem.Message{Headers: map[string]string{"content-type": "application/cloudevents+avro"}, Body: []byte{1, 2}}, "application/cloudevents+avro")
	wantUndecodable(t, "a batch", idem.Message{Headers: map[string]string{"content-type": "application/cloudevents-batch+json"}, Body: []byte(`[]`)}, "JSON event format")
}

func TestCloudEventsIDs(t *testing.T) {
	t.Parallel()
	attrs := minimal()
	attrs["id"] = "E42"
	ev, err := idem.Decode(binary(attrs, `{"n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID.String() != "3f240152-ed00-547c-b98c-d4d274c69d5e" || ev.Headers[idem.HeaderOriginalID] != "E42" || ev.Headers["ce_id"] != "E42" {
		t.Errorf("non-UUID id: %v, headers %v", ev.ID, ev.Headers)
	}
	if want, _ := idem.EventID("E42"); ev.ID != want {
		t.Errorf("id %v, want idem.EventID's %v", ev.ID, want)
	}
	attrs["id"] = "urn:uuid:0193A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B"
	ev, err = idem.Decode(binary(attrs, `{}`))
	if err != nil || ev.ID.String() != "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b" || ev.Headers[idem.HeaderOriginalID] != "" {
		t.Errorf("a UUID spelled otherwise: %v %v %v", ev.ID, ev.Headers, err)
	}
	attrs["id"] = strings.Repeat("x", 65)
	wantUndecodable(t, "a 65-byte id", binary(attrs, `{}`), "id ", "65 bytes")
	attrs["id"] = uuid.Nil.String()
	wantUndecodable(t, "the nil UUID", binary(attrs, `{}`), "nil UUID")
}

func TestCloudEventsTimeFormats(t *testing.T) {
	t.Parallel()
	want := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	for in, add := range map[string]time.Duration{
		"2026-12-02T08:00:00Z":                0,
		"2026-12-02t08:00:00z":                0,
		"2026-12-02T09:00:00+01:00":           0,
		"2026-12-02T03:30:00-04:30":           0,
		"2026-12-02T08:00:00.5Z":              500 * time.Millisecond,
		"2026-12-02T08:00:00.123456789Z":      123456789,
		"2026-12-02T08:00:00.123456789+00:00": 123456789,
	} {
		attrs := minimal()
		attrs["time"] = in
		ev, err := idem.Decode(binary(attrs, `{}`))
		if err != nil || !ev.OccurredAt.Equal(want.Add(add)) || ev.OccurredAt.Location() != time.UTC {
			t.Errorf("time %q: %v, %v; want %v", in, ev.OccurredAt, err, want.Add(add))
		}
	}
	for _, in := range []string{"2026-12-02 08:00:00Z", "2026-12-02", "2026-12-02T08:00:00", "yesterday", "2026-13-02T08:00:00Z", "0001-01-01T00:00:00+01:00"} {
		attrs := minimal()
		attrs["time"] = in
		wantUndecodable(t, "time "+in, binary(attrs, `{}`), "time", "RFC 3339")
	}
}

func TestCloudEventsData(t *testing.T) {
	t.Parallel()
	attrs := minimal()
	attrs["datacontenttype"] = "application/protobuf"
	// Data that is not JSON is the payload's bytes as received, with its
	// content type: white space around them is theirs.
	raw := " \x08\x96\x01\x00\n"
	ev, err := idem.Decode(binary(attrs, raw))
	if err != nil || ev.ContentType != "application/protobuf" || string(ev.Payload) != raw {
		t.Errorf("protobuf data: %q %q %v", ev.ContentType, ev.Payload, err)
	}
	msg := binary(minimal(), "\x08\x96\x01")
	msg.Headers["content-type"] = "application/protobuf"
	ev, err = idem.Decode(msg)
	if err != nil || ev.ContentType != "application/protobuf" || string(ev.Payload) != "\x08\x96\x01" {
		t.Errorf("protobuf in content-type: %q %q %v", ev.ContentType, ev.Payload, err)
	}
	attrs["datacontenttype"] = "protobuf"
	wantUndecodable(t, "not a media type", binary(attrs, "\x08"), "datacontenttype", "not a media type")
	wantUndecodable(t, "text without a content type", binary(minimal(), "hello"), "data is not JSON")
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "application/vnd.shop.order+json", "text/json", "Application/JSON"} {
		msg := binary(minimal(), `{"n":1}`)
		msg.Headers["content-type"] = ct
		ev, err := idem.Decode(msg)
		if err != nil || string(ev.Payload) != `{"n":1}` {
			t.Errorf("content type %q: %s %v", ct, ev.Payload, err)
		}
	}
	ev, err = idem.Decode(binary(minimal(), ""))
	if err != nil || string(ev.Payload) != "null" {
		t.Errorf("no data: %s %v", ev.Payload, err)
	}
	sattrs := map[string]any{"specversion": "1.0", "id": "x-1", "source": "/s", "type": "t", "data_base64": []byte(`{"n":2}`)}
	ev, err = idem.Decode(structured(sattrs, ""))
	if err != nil || string(ev.Payload) != `{"n":2}` {
		t.Errorf("data_base64: %s %v", ev.Payload, err)
	}
	wantUndecodable(t, "data and data_base64", structured(sattrs, `{}`), "data_base64")
	sattrs["data_base64"] = []byte("<xml/>\x00")
	sattrs["datacontenttype"] = "application/xml"
	ev, err = idem.Decode(structured(sattrs, ""))
	if err != nil || ev.ContentType != "application/xml" || string(ev.Payload) != "<xml/>\x00" {
		t.Errorf("xml in data_base64: %q %q %v", ev.ContentType, ev.Payload, err)
	}
	delete(sattrs, "data_base64")
	ev, err = idem.Decode(structured(sattrs, `"<xml/>"`))
	if err != nil || ev.ContentType != "application/xml" || string(ev.Payload) != "<xml/>" {
		t.Errorf("xml in a data string: %q %q %v", ev.ContentType, ev.Payload, err)
	}
	wantUndecodable(t, "xml in a data object", structured(sattrs, `{"a":1}`), "data", "not a string")
}

func TestCloudEventsMapping(t *testing.T) {
	t.Parallel()
	attrs := minimal()
	attrs["subject"] = "42"
	attrs["aggregatetype"] = "order"
	attrs["aggregateversion"] = "7"
	attrs["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	attrs["tenant"] = "acme"
	msg := binary(attrs, `{"n":1}`)
	msg.Headers["x-app"] = "v"
	ev, err := idem.Decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Name != "com.example.thing.created" || ev.AggregateID != "42" || ev.AggregateType != "order" || ev.AggregateVersion != 7 {
		t.Errorf("mapped %+v", ev)
	}
	if ev.Headers["traceparent"] != attrs["traceparent"] || ev.Headers["ce_tenant"] != "acme" || ev.Headers["x-app"] != "v" || ev.Headers["ce_source"] != "/third/party" {
		t.Errorf("headers %v", ev.Headers)
	}
	// Without subject and aggregatetype: the transport's key and aggregate type.
	ev, err = idem.Decode(idem.Message{Key: []byte("k-9"), AggregateType: "thing", Headers: binary(minimal(), "{}").Headers, Body: []byte("{}")})
	if err != nil || ev.AggregateID != "k-9" || ev.AggregateType != "thing" {
		t.Errorf("defaults from the transport: %+v %v", ev, err)
	}
}

func TestCloudEventsBindingsOnReceipt(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"cloudEvents_", "cloudEvents:", "ce-", "Ce-", "ce_"} {
		h := map[string]string{}
		for k, v := range minimal() {
			h[prefix+k] = v
		}
		h[prefix+"subject"] = "a b"
		if strings.EqualFold(prefix, "ce-") {
			h[prefix+"subject"] = `"a%20b"`
		}
		ev, err := idem.Decode(idem.Message{Headers: h, Body: []byte(`{"n":1}`)})
		if err != nil || ev.Name != "com.example.thing.created" || ev.AggregateID != "a b" {
			t.Errorf("prefix %q: %+v %v", prefix, ev, err)
		}
	}
	h := map[string]string{"ce-specversion": "1.0", "ce-id": "1", "ce-source": "/s", "ce-type": "t", "ce-subject": "%C0%A0"}
	wantUndecodable(t, "an overlong UTF-8 sequence", idem.Message{Headers: h, Body: []byte("{}")}, "subject", "UTF-8")
	h["ce-subject"] = "%4"
	wantUndecodable(t, "a truncated escape", idem.Message{Headers: h, Body: []byte("{}")}, "subject")
	// A message without content type, with the JSON event format's shape.
	ev, err := idem.Decode(idem.Message{Body: []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","data":{"n":1}}`)})
	if err != nil || ev.Name != "t" || string(ev.Payload) != `{"n":1}` {
		t.Errorf("structured without content type: %+v %v", ev, err)
	}
}

func TestCloudEventsAttributeNames(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"aggregatetype": true, "aggregateversion": true, "traceparent": true, "tracestate": true, "a1": true,
		"": false, "Foo": false, "foo_bar": false, "foo-bar": false, "é": false, "abcdefghijklmnopqrstu": false,
	} {
		if idem.IsCloudEventsAttributeName(name) != ok {
			t.Errorf("IsCloudEventsAttributeName(%q) = %v", name, !ok)
		}
	}
	// Every attribute idem writes has a valid name.
	msg, err := idem.CloudEvents{Mode: idem.CloudEventsStructured}.EncodeEvent(tracedEvent(), idem.CloudEventsKafka)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(msg.Body, &obj); err != nil {
		t.Fatal(err)
	}
	for name := range obj {
		if name != "data" && !idem.IsCloudEventsAttributeName(name) {
			t.Errorf("idem writes the invalid attribute name %q", name)
		}
	}
	wantUndecodable(t, "an upper-case member", structured(map[string]any{"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "Tenant": "x"}, `{}`), `"Tenant"`)
	attrs := minimal()
	attrs["foo-bar"] = "x"
	wantUndecodable(t, "a header with a dash", binary(attrs, `{}`), "ce_foo-bar")
	wantUndecodable(t, "an object extension", structured(map[string]any{"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "ext": map[string]int{}}, `{}`), "ext")
}

// Headers named as attributes are extension attributes, in every binding
// and mode, but for the attributes written from the event.
func TestCloudEventsExtensionsFromHeaders(t *testing.T) {
	t.Parallel()
	ev := goldenEvent()
	ev.Headers = map[string]string{"ce_tenant": "acme corp", "cloudEvents_region": "eu", "ce-source": "/forged", "ce_id": "forged", "ce_Bad_Name": "x", "content-type": "text/plain"}
	for name, b := range bindings {
		for _, mode := range []idem.CloudEventsMode{idem.CloudEventsBinary, idem.CloudEventsStructured} {
			msg, err := idem.CloudEvents{Mode: mode}.EncodeEvent(ev, b)
			if err != nil {
				t.Fatal(err)
			}
			back, err := idem.Decode(msg)
			if err != nil {
				t.Fatalf("%s %s: %v", name, mode, err)
			}
			if back.Headers["ce_tenant"] != "acme corp" || back.Headers["ce_region"] != "eu" || back.Headers["ce_source"] != "/idem/order" ||
				back.ID != ev.ID || back.Headers["ce_bad_name"] != "" {
				t.Errorf("%s %s: headers %v", name, mode, back.Headers)
			}
		}
	}
}

func TestCloudEventsConfig(t *testing.T) {
	t.Parallel()
	if err := (idem.CloudEvents{Source: "/a b"}).Validate(); err == nil || !strings.Contains(err.Error(), "CloudEvents.Source") {
		t.Errorf("a source with a space: %v", err)
	}
	if err := (idem.CloudEvents{Mode: 7}).Validate(); err == nil || !strings.Contains(err.Error(), "CloudEvents.Mode") {
		t.Errorf("mode 7: %v", err)
	}
	for _, s := range []string{"/shop/order", "https://shop.example.com/order", "urn:shop:order", "order"} {
		if err := (idem.CloudEvents{Source: s}).Validate(); err != nil {
			t.Errorf("source %q: %v", s, err)
		}
	}
	// Encode reads an envelope message and keeps its transport fields.
	env, err := idem.NewMessage(goldenEvent())
	if err != nil {
		t.Fatal(err)
	}
	msg, err := idem.CloudEvents{}.Encode(env, idem.CloudEventsKafka)
	if err != nil || msg.EventID != env.EventID || string(msg.Key) != "42" || msg.EventName != env.EventName || msg.Headers["ce_id"] != env.EventID.String() {
		t.Errorf("Encode of an envelope: %+v %v", msg, err)
	}
	_, err = idem.CloudEvents{}.Encode(idem.Message{Body: []byte("nope")}, idem.CloudEventsKafka)
	if !errors.Is(err, idem.ErrUndecodable) {
		t.Errorf("Encode of an undecodable message: %v", err)
	}
}

// FuzzDecodeCloudEvents checks the decoder's CloudEvents path: no input
// makes it panic, every error is an undecodable-message error, and an event
// it reads encodes, in every binding and mode, to a CloudEvent that decodes
// to the same event.
func FuzzDecodeCloudEvents(f *testing.F) {
	f.Add(uint8(0), "1.0", "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "/s", "order.placed", "2026-12-02T08:00:00Z", "42", "application/json", "ext", "v", []byte(`{"n":1}`))
	f.Add(uint8(1), "1.0", "E42", "urn:x", "t", "2026-12-02t08:00:00.123456789+01:00", "a b", "", "aggregateversion", "3", []byte(``))
	f.Add(uint8(2), "1.0", "%41", "/s", "t", "", "%C3%A9", "application/protobuf", "traceparent", "00-x", []byte{8, 1})
	f.Add(uint8(3), "1.0", "1", "/s", "t", "", "", "text/json", "data", "x", []byte(`"str"`))
	f.Add(uint8(4), "", "", "", "", "", "", "application/cloudevents+json", "", "", []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","subject":"s","aggregatetype":"a","data_base64":"e30="}`))
	f.Add(uint8(5), "", "", "", "", "", "", "", "", "", []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","aggregateversion":1e3,"data":null}`))
	f.Add(uint8(0), "1.0", "1", "/s", "t", "", "42", "application/x-protobuf", "aggregatetype", "order", []byte(" \x00\xff\n"))
	f.Add(uint8(4), "", "", "", "", "", "", "application/cloudevents+json", "", "", []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","subject":"s","aggregatetype":"a","datacontenttype":"application/avro","data_base64":"AP8="}`))
	f.Add(uint8(5), "", "", "", "", "", "", "", "", "", []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","subject":"s","aggregatetype":"a","datacontenttype":"text/plain","data":"hi"}`))
	f.Fuzz(func(t *testing.T, form uint8, sv, id, source, typ, tm, subject, ct, extName, extValue string, body []byte) {
		var msg idem.Message
		prefixes := []string{"ce_", "ce-", "cloudEvents_", "cloudEvents:"}
		switch p := int(form) % 6; {
		case p < 4:
			h := map[string]string{}
			for k, v := range map[string]string{"specversion": sv, "id": id, "source": source, "type": typ, "time": tm, "subject": subject, extName: extValue} {
				if v != "" && k != "" {
					h[prefixes[p]+k] = v
				}
			}
			if ct != "" {
				h["content-type"] = ct
			}
			msg = idem.Message{Headers: h, Body: body, Key: []byte(subject)}
		case p == 4:
			msg = idem.Message{Headers: map[string]string{"Content-Type": ct}, Body: body}
		default:
			msg = idem.Message{Body: body}
		}
		ev, err := idem.Decoder{MaxBodyBytes: 4096}.Decode(msg)
		if err != nil {
			if !errors.Is(err, idem.ErrUndecodable) {
				t.Fatalf("error %v is not ErrUndecodable", err)
			}
			return
		}
		if ev.Name == "" || ev.AggregateType == "" || ev.AggregateID == "" {
			return // not encodable: fine for a received message
		}
		for _, b := range []idem.CloudEventsBinding{idem.CloudEventsKafka, idem.CloudEventsAMQP, idem.CloudEventsNATS} {
			for _, mode := range []idem.CloudEventsMode{idem.CloudEventsBinary, idem.CloudEventsStructured} {
				out, err := idem.CloudEvents{Mode: mode}.EncodeEvent(ev, b)
				if err != nil {
					t.Fatalf("encode %+v in %s %s: %v", ev, b.Name, mode, err)
				}
				back, err := idem.Decode(out)
				if err != nil {
					t.Fatalf("decode of %s %s %q %v: %v", b.Name, mode, out.Body, out.Headers, err)
				}
				if back.ID != ev.ID || back.Name != ev.Name || back.AggregateID != ev.AggregateID || back.AggregateType != ev.AggregateType ||
					back.AggregateVersion != ev.AggregateVersion || !back.OccurredAt.Equal(ev.OccurredAt.Truncate(time.Microsecond)) ||
					back.ContentType != ev.ContentType || !samePayload(t, ev, back) {
					t.Fatalf("%s %s: %+v decodes back as %+v", b.Name, mode, ev, back)
				}
			}
		}
	})
}

// samePayload compares the payloads of a and b: as JSON values when they
// are JSON, else byte for byte.
func samePayload(t *testing.T, a, b idem.Event) bool {
	if a.IsJSON() {
		return compact(t, a.Payload) == compact(t, b.Payload)
	}
	return bytes.Equal(a.Payload, b.Payload)
}
