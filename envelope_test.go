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

const golden = `{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"order.order.placed.v1","occurred_at":"2026-12-02T08:00:00.123456Z","aggregate_type":"order","aggregate_id":"42","aggregate_version":3,"payload":{"orderId":"42","lines":[{"productId":"p-1","quantity":"2.000"}]}}`

func goldenEvent() idem.Event {
	return idem.Event{
		ID:               uuid.MustParse("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
		Name:             "order.order.placed.v1",
		OccurredAt:       time.Date(2026, 12, 2, 9, 0, 0, 123456789, time.FixedZone("CET", 3600)),
		AggregateType:    "order",
		AggregateID:      "42",
		AggregateVersion: 3,
		Payload:          json.RawMessage(`{"orderId": "42", "lines": [{"productId": "p-1", "quantity": "2.000"}]}`),
	}
}

func TestMarshalEnvelopeIsByteStable(t *testing.T) {
	got, err := idem.MarshalEnvelope(goldenEvent())
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != golden {
		t.Fatalf("envelope:\n got %s\nwant %s", got, golden)
	}
	ev, err := idem.Decode(idem.Message{Body: got})
	if err != nil {
		t.Fatal(err)
	}
	again, _ := idem.MarshalEnvelope(ev)
	if !bytes.Equal(again, got) {
		t.Fatalf("decode then encode changed the bytes:\n%s\n%s", again, got)
	}
}

func TestMarshalEnvelopeEscapes(t *testing.T) {
	ev := goldenEvent()
	ev.AggregateID = "a\"b\\c\n<d>\u2028\x01\xff"
	b, err := idem.MarshalEnvelope(ev)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatalf("invalid JSON: %s", b)
	}
	back, err := idem.Decode(idem.Message{Body: b})
	if err != nil {
		t.Fatal(err)
	}
	if back.AggregateID != "a\"b\\c\n<d>\u2028\x01\ufffd" {
		t.Fatalf("aggregate id = %q", back.AggregateID)
	}
}

func TestDecodeErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, body string
		headers    map[string]string
		field      string
		problem    string
	}{
		{"not json", `not json`, nil, "body", "is not JSON"},
		{"empty", ``, nil, "body", "is empty"},
		{"array", `[1,2]`, nil, "body", "not a JSON object"},
		{"missing event_id", `{"event_name":"a.b.c.v1","payload":{}}`, nil, "event_id", "is missing"},
		{"null event_id", `{"event_id":null,"event_name":"a.b.c.v1","payload":{}}`, nil, "event_id", "is missing"},
		{"event_id not uuid", `{"event_id":"E42","event_name":"a.b.c.v1","payload":{}}`, nil, "event_id", "is not a UUID"},
		{"event_id number", `{"event_id":42,"event_name":"a.b.c.v1","payload":{}}`, nil, "event_id", "is not a string"},
		{"missing name", `{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","payload":{}}`, nil, "event_name", "is missing"},
		{"missing payload", `{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a.b.c.v1"}`, nil, "payload", "is missing"},
		{"bad time", `{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a.b.c.v1","occurred_at":"yesterday","payload":{}}`, nil, "occurred_at", "RFC 3339"},
		{"time out of range", `{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a.b.c.v1","occurred_at":"9999-12-31T23:00:00-14:00","payload":{}}`, nil, "occurred_at", "out of range"},
		{"bad version", `{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a.b.c.v1","aggregate_version":"3","payload":{}}`, nil, "aggregate_version", "integer"},
		{"debezium bad id", `{"orderId":42}`, map[string]string{"id": "no\npe"}, "id header", `"no\npe" holds the control character 0x0a`},
		{"debezium payload not json", `{"orderId":`, map[string]string{"id": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"}, "payload", "is not JSON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idem.Decode(idem.Message{Body: []byte(tc.body), Headers: tc.headers})
			var fe *idem.FieldError
			if !errors.Is(err, idem.ErrUndecodable) || !errors.As(err, &fe) {
				t.Fatalf("err = %v; want an undecodable FieldError", err)
			}
			if fe.Field != tc.field || !strings.Contains(fe.Problem, tc.problem) {
				t.Fatalf("err = %q; want field %q with %q", err, tc.field, tc.problem)
			}
		})
	}
}

func TestDecodeBodyLimit(t *testing.T) {
	body := []byte(golden)
	_, err := idem.Decoder{MaxBodyBytes: len(body) - 1}.Decode(idem.Message{Body: body})
	var fe *idem.FieldError
	if !errors.As(err, &fe) || fe.Field != "body" || !strings.Contains(fe.Problem, "limit") {
		t.Fatalf("err = %v; want the body over the limit", err)
	}
	if _, err := (idem.Decoder{MaxBodyBytes: len(body)}).Decode(idem.Message{Body: body}); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeDebeziumEventRouter(t *testing.T) {
	id := "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	headers := map[string]string{"id": id, "eventType": "OrderCreated"}
	for name, msg := range map[string]idem.Message{
		"bare payload":       {Key: []byte("42"), Headers: headers, Body: []byte(`{"orderId":42,"schemaVersion":1}`)},
		"payload as string":  {Key: []byte(`"42"`), Headers: headers, Body: []byte(`"{\"orderId\":42,\"schemaVersion\":1}"`)},
		"json converter":     {Key: []byte(`{"schema":{"type":"string"},"payload":"42"}`), Headers: headers, Body: []byte(`{"schema":{"type":"string"},"payload":"{\"orderId\":42,\"schemaVersion\":1}"}`)},
		"whitespace in body": {Key: []byte("42"), Headers: headers, Body: []byte("\n {\"orderId\":42,\"schemaVersion\":1} ")},
	} {
		t.Run(name, func(t *testing.T) {
			ev, err := idem.Decode(msg)
			if err != nil {
				t.Fatal(err)
			}
			if ev.ID.String() != id || ev.Name != "OrderCreated" || ev.AggregateID != "42" {
				t.Fatalf("event = %+v", ev)
			}
			var p struct{ OrderID, SchemaVersion int }
			if err := json.Unmarshal(ev.Payload, &p); err != nil || p.OrderID != 42 || p.SchemaVersion != 1 {
				t.Fatalf("payload = %s (%v)", ev.Payload, err)
			}
		})
	}
	// No eventType header: undecodable (never ignored), with the id and the
	// aggregate read, for the failure store.
	ev, err := idem.Decode(idem.Message{Key: []byte("42"), AggregateType: "order", Headers: map[string]string{"id": id}, Body: []byte(`{}`)})
	if !errors.Is(err, idem.ErrUndecodable) || !strings.Contains(err.Error(), "eventType") ||
		ev.ID.String() != id || ev.AggregateType != "order" || ev.AggregateID != "42" {
		t.Fatalf("without eventType: %+v, %v", ev, err)
	}
	// A transport's default name for the topic stands in for the header.
	ev, err = idem.Decode(idem.Message{Key: []byte("42"), EventName: "OrderCreated", Headers: map[string]string{"id": id}, Body: []byte(`{}`)})
	if err != nil || ev.Name != "OrderCreated" {
		t.Fatalf("with a default name: %+v, %v", ev, err)
	}
}

// TestDecodeDebeziumIDs: the "id" header of a Debezium record is the outbox
// row's id as written (Debezium's article has id VARCHAR(64) and calls an
// event E42). It becomes the event id by the rule the relays apply to the
// same row, idem.EventID, so that one row is one event whichever path
// published it: a UUID is itself; another id of 1 to 64 bytes gives its
// derived UUID, with the id in idem-original-id, as the relays send it.
func TestDecodeDebeziumIDs(t *testing.T) {
	t.Parallel()
	const u = "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	for _, c := range []struct {
		name, id, want, original string
	}{
		{"E42", "E42", "3f240152-ed00-547c-b98c-d4d274c69d5e", "E42"},
		{"a UUID", u, u, ""},
		{"a UUID in capitals", strings.ToUpper(u), u, ""},
		{"a UUID in braces", "{" + u + "}", u, ""},
		{"a UUID URN", "urn:uuid:" + u, u, ""},
		{"64 bytes", strings.Repeat("E42-", 16), "", strings.Repeat("E42-", 16)},
		{"64 bytes of 32 characters", strings.Repeat("\u00e9", 32), "", strings.Repeat("\u00e9", 32)},
		{"spaces are part of the id", " " + u, "", " " + u},
	} {
		t.Run(c.name, func(t *testing.T) {
			want, err := idem.EventID(c.id)
			if err != nil {
				t.Fatal(err)
			}
			if c.want != "" && want.String() != c.want {
				t.Fatalf("idem.EventID(%q) = %s, want %s", c.id, want, c.want)
			}
			headers := map[string]string{"id": c.id, "eventType": "OrderCreated", "traceparent": "00-abc-def-01"}
			msg := idem.Message{Key: []byte(`"42"`), AggregateType: "order", Headers: headers, Body: []byte(`"{\"orderId\":42}"`)}
			ev, err := idem.Decode(msg)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			original, has := ev.Headers[idem.HeaderOriginalID]
			if ev.ID != want || original != c.original || has != (c.original != "") {
				t.Errorf("event id %s, %s %q (present %v); want %s and %q", ev.ID, idem.HeaderOriginalID, original, has, want, c.original)
			}
			if ev.Name != "OrderCreated" || ev.AggregateType != "order" || ev.AggregateID != "42" || string(ev.Payload) != `{"orderId":42}` ||
				ev.Headers["id"] != c.id || ev.Headers["traceparent"] != "00-abc-def-01" {
				t.Errorf("decoded as %+v", ev)
			}
			if len(headers) != 3 {
				t.Errorf("the message's headers were changed: %v", headers)
			}
			// The relays' message for the same row, in the envelope or
			// with Kafka's bare payload, decodes to the same event.
			relayed, err := idem.NewMessage(idem.Event{ID: want, Name: "OrderCreated", AggregateType: "order", AggregateID: "42",
				Payload: json.RawMessage(`{"orderId":42}`), Headers: map[string]string{idem.HeaderOriginalID: c.original}})
			if err != nil {
				t.Fatal(err)
			}
			if c.original == "" {
				delete(relayed.Headers, idem.HeaderOriginalID)
			}
			bare := idem.Message{Key: relayed.Key, AggregateType: "order", Body: []byte(`{"orderId":42}`),
				Headers: map[string]string{"id": want.String(), "eventType": "OrderCreated"}}
			if c.original != "" {
				bare.Headers[idem.HeaderOriginalID] = c.original
			}
			for form, m := range map[string]idem.Message{"envelope": relayed, "bare payload": bare} {
				rev, err := idem.Decode(m)
				if err != nil || rev.ID != ev.ID || rev.Headers[idem.HeaderOriginalID] != original {
					t.Errorf("the relays' %s decodes to %s with %s %q (%v); Debezium's record to %s with %q",
						form, rev.ID, idem.HeaderOriginalID, rev.Headers[idem.HeaderOriginalID], err, ev.ID, original)
				}
			}
		})
	}
	// A header idem-original-id that the record carries is replaced by the
	// id, as the relays replace one in the row's headers, when the id is
	// derived; with a UUID id it is the record's own and stays.
	ev, err := idem.Decode(idem.Message{Key: []byte("42"), Body: []byte(`{}`),
		Headers: map[string]string{"id": "E42", "eventType": "OrderCreated", idem.HeaderOriginalID: "E41"}})
	if err != nil || ev.Headers[idem.HeaderOriginalID] != "E42" {
		t.Errorf("a stale %s: %v, %v; want E42", idem.HeaderOriginalID, ev.Headers, err)
	}
	ev, err = idem.Decode(idem.Message{Key: []byte("42"), Body: []byte(`{}`),
		Headers: map[string]string{"id": u, "eventType": "OrderCreated", idem.HeaderOriginalID: "E41"}})
	if err != nil || ev.ID.String() != u || ev.Headers[idem.HeaderOriginalID] != "E41" {
		t.Errorf("a UUID id with %s: %s %v, %v; want the id and the header as sent", idem.HeaderOriginalID, ev.ID, ev.Headers, err)
	}
}

// TestDecodeDebeziumRefusedIDs: an id idem.EventID refuses (the relays
// quarantine such a row) makes the record undecodable: parked with its
// bytes, the error saying what is wrong with the id, the aggregate read so
// that the record holds its aggregate's later events.
func TestDecodeDebeziumRefusedIDs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, id, problem string }{
		{"65 bytes", strings.Repeat("x", 65), `is 65 bytes long, more than 64: an event id is a UUID, or 1 to 64 bytes`},
		{"66 bytes of 33 characters", strings.Repeat("\u00e9", 33), `is 66 bytes long, more than 64`},
		{"empty", "", `"" is empty`},
		{"a control character", "E42\n", `"E42\n" holds the control character 0x0a`},
		{"a NUL", "E\x0042", `holds the control character 0x00`},
		{"not UTF-8", "E\xff42", `"E\xff42" is not valid UTF-8`},
		{"the nil UUID", "00000000-0000-0000-0000-000000000000", "is the nil UUID"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev, err := idem.Decode(idem.Message{Key: []byte("42"), AggregateType: "order", Body: []byte(`{"orderId":42}`),
				Headers: map[string]string{"id": c.id, "eventType": "OrderCreated"}})
			var fe *idem.FieldError
			if !errors.Is(err, idem.ErrUndecodable) || !errors.As(err, &fe) {
				t.Fatalf("Decode = %+v, %v; want an undecodable message", ev, err)
			}
			if fe.Field != "id header" || !strings.Contains(fe.Problem, c.problem) {
				t.Errorf("error %q; want the field \"id header\" and %q", err, c.problem)
			}
			if ev.ID != uuid.Nil || ev.AggregateType != "order" || ev.AggregateID != "42" {
				t.Errorf("with the error: %+v; want no id and the aggregate order/42", ev)
			}
		})
	}
}

// TestDebeziumPayloadsThatLookLikeEnvelopes: a record with an "id" header
// whose bare payload has an "event_id" field of the application's, but not
// the envelope's other fields, is read by its headers; a payload that is a
// JSON string not holding JSON is that string.
func TestDebeziumPayloadsThatLookLikeEnvelopes(t *testing.T) {
	id := "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	headers := map[string]string{"id": id, "eventType": "PaymentCaptured"}
	for body, want := range map[string]string{
		`{"event_id":"e-17","amount":"12.00"}`:                             `{"event_id":"e-17","amount":"12.00"}`,
		`{"event_id":"0193a1b2-0000-7000-8000-000000000000","payload":{}}`: `{"event_id":"0193a1b2-0000-7000-8000-000000000000","payload":{}}`,
		`"abc"`:       `"abc"`,
		`"{not json"`: `"{not json"`,
		`"\"abc\""`:   `"abc"`,
	} {
		ev, err := idem.Decode(idem.Message{Key: []byte("7"), Headers: headers, Body: []byte(body)})
		if err != nil {
			t.Errorf("%s: %v", body, err)
			continue
		}
		if ev.ID.String() != id || ev.Name != "PaymentCaptured" || ev.AggregateID != "7" || string(ev.Payload) != want {
			t.Errorf("%s: decoded as %s %s %s payload %s, want the record's headers and payload %s", body, ev.ID, ev.Name, ev.AggregateID, ev.Payload, want)
		}
	}
	// Without an "id" header the body must be an envelope.
	if _, err := idem.Decode(idem.Message{Body: []byte(`{"event_id":"e-17","amount":"12.00"}`)}); !errors.Is(err, idem.ErrUndecodable) {
		t.Errorf("an object with event_id and no id header: %v, want undecodable", err)
	}
}

func TestEnvelopeWinsOverHeaders(t *testing.T) {
	ev, err := idem.Decode(idem.Message{Body: []byte(golden), Headers: map[string]string{"id": "0193a1b2-0000-7000-8000-000000000000"}})
	if err != nil || ev.ID.String() != "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b" {
		t.Fatalf("%+v, %v", ev, err)
	}
}

func TestNumericAggregateID(t *testing.T) {
	ev, err := idem.Decode(idem.Message{Body: []byte(`{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a.b.c.v1","aggregate_id":42,"payload":null}`)})
	if err != nil || ev.AggregateID != "42" {
		t.Fatalf("%+v, %v", ev, err)
	}
}

func TestNewEventIDIsV7(t *testing.T) {
	a, b := idem.NewEventID(), idem.NewEventID()
	if a.Version() != 7 || a == b {
		t.Fatalf("ids %v %v", a, b)
	}
}

// FuzzDecode checks that no input makes the decoder panic, that every error
// is an undecodable-message error, and that what decodes re-encodes to an
// envelope that decodes to the same event.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(golden), []byte("42"), "", "")
	f.Add([]byte(`{"orderId":42}`), []byte(`"42"`), "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "OrderCreated")
	f.Add([]byte(`"{\"orderId\":42}"`), []byte(`{"schema":{},"payload":"42"}`), "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "")
	f.Add([]byte(`{"schema":{},"payload":"\"x\""}`), []byte{}, "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "x")
	f.Add([]byte(`{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a","aggregate_id":1e400,"payload":1}`), []byte{}, "", "")
	f.Add([]byte(`{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"\u0000","occurred_at":"9999-12-31T23:59:59.999999999+14:00","aggregate_version":9223372036854775807,"payload":"é"}`), []byte{}, "", "")
	f.Add([]byte(`{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a","aggregate_type":"t","aggregate_id":"1","occurred_at":"9999-12-31T23:59:59Z","payload":{}}`), []byte{}, "", "")
	f.Add([]byte("\xff\xfe"), []byte("\xff"), "\x00", "\xff")
	f.Add([]byte(`[]`), []byte{}, "", "")
	f.Add([]byte(`{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a","aggregate_type":"t","aggregate_id":"1","content_type":"application/x-protobuf","payload_base64":"AAH/"}`), []byte{}, "", "")
	f.Add([]byte(`{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a","aggregate_type":"t","aggregate_id":"1","payload_base64":""}`), []byte{}, "", "")
	f.Add([]byte(`{"event_id":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","event_name":"a","aggregate_type":"t","aggregate_id":"1","content_type":"application/vnd.x+json","payload":{"a":1}}`), []byte{}, "", "")
	f.Add([]byte(`{"orderId":42}`), []byte("42"), "E42", "OrderCreated")
	f.Add([]byte(`"{\"orderId\":42}"`), []byte(`"42"`), strings.Repeat("E42-", 16), "OrderCreated")
	f.Add([]byte(`{}`), []byte("42"), strings.Repeat("x", 65), "OrderCreated")
	f.Add([]byte(`{}`), []byte("42"), "E\x0042", "OrderCreated")
	f.Add([]byte(`{}`), []byte("42"), "{0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b}", "OrderCreated")
	f.Fuzz(func(t *testing.T, body, key []byte, id, eventType string) {
		headers := map[string]string{}
		if id != "" {
			headers["id"] = id
		}
		if eventType != "" {
			headers["eventType"] = eventType
		}
		ev, err := idem.Decoder{MaxBodyBytes: 4096}.Decode(idem.Message{Body: body, Key: key, Headers: headers})
		if err != nil {
			if !errors.Is(err, idem.ErrUndecodable) {
				t.Fatalf("error %v is not ErrUndecodable", err)
			}
			return
		}
		// The message has no idem-original-id: one on the event is the id
		// header the decoder derived the event id from, by idem.EventID.
		if original, ok := ev.Headers[idem.HeaderOriginalID]; ok {
			want, err := idem.EventID(original)
			if original != id || err != nil || want != ev.ID || !idem.IsDerivedEventID(original) {
				t.Fatalf("event %s with %s %q from the id header %q: idem.EventID gives %s, %v", ev.ID, idem.HeaderOriginalID, original, id, want, err)
			}
		} else if id != "" && idem.IsDerivedEventID(id) && ev.Headers["id"] == id && ev.ID != uuid.Nil {
			if want, _ := idem.EventID(id); want == ev.ID {
				t.Fatalf("event %s derived from the id header %q without %s", ev.ID, id, idem.HeaderOriginalID)
			}
		}
		if ev.Name == "" || ev.AggregateType == "" || ev.AggregateID == "" {
			return // not encodable as an envelope: fine for a received message
		}
		b, err := idem.MarshalEnvelope(ev)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", ev, err)
		}
		back, err := idem.Decode(idem.Message{Body: b})
		if err != nil {
			t.Fatalf("decode of re-encoded %s: %v", b, err)
		}
		b2, _ := idem.MarshalEnvelope(back)
		if !bytes.Equal(b, b2) {
			t.Fatalf("not stable:\n%s\n%s", b, b2)
		}
	})
}
