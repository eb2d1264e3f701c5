package outboxcodec_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
)

// textColumns are the columns DecodeText reads, in the order of the fuzz
// target's arguments.
var textColumns = [...]string{"id", "aggregatetype", "aggregateid", "type", "payload", "occurred_at",
	"aggregate_version", "headers", "seq", "created_at", "attempts"}

// FuzzDecodeOutboxText decodes rows of arbitrary column texts, some absent
// (bit i of absent) or NULL (bit i of nulls): it never panics, fails only
// on a typed column's text, and a row it finds readable has a UUID, headers
// that decode, and the column texts it was given.
func FuzzDecodeOutboxText(f *testing.F) {
	seed := func(cols map[string]columnText) {
		var vals [13]string
		var absent, nulls uint16
		for i, c := range textColumns {
			v, ok := cols[c]
			switch {
			case !ok || !v.present:
				absent |= 1 << i
			case v.null:
				nulls |= 1 << i
			default:
				vals[i] = v.text
			}
		}
		f.Add(vals[0], vals[1], vals[2], vals[3], vals[4], vals[5], vals[6], vals[7], vals[8], vals[9], vals[10], vals[11], vals[12], absent, nulls)
	}
	id := uuid.NewString()
	seed(fullRow(id))
	seed(map[string]columnText{"id": text(id), "aggregatetype": text("order"), "aggregateid": text("42"),
		"type": text("OrderCreated"), "payload": null})
	for column, value := range map[string]columnText{
		"id": text(""), "headers": text("[1]"), "aggregate_version": text("three"),
		"occurred_at": text("2026-12-03 16:15:00+05:30:12"), "created_at": text("infinity"), "seq": text("-9223372036854775808"),
	} {
		cols := fullRow(id)
		cols[column] = value
		seed(cols)
	}
	for _, other := range []string{"not-a-uuid", "E42", "{" + id + "}", string(make([]byte, 65))} {
		seed(fullRow(other))
	}
	binary := fullRow(id)
	binary["payload"], binary["content_type"], binary["payload_binary"] = null, text("application/x-protobuf"), text(`\x00ff0a`)
	seed(binary)
	binary["payload_binary"] = text(`\x0`)
	seed(binary)
	binary["payload"] = text(`{}`)
	seed(binary)

	f.Fuzz(func(t *testing.T, id, aggType, aggID, typ, payload, occurredAt, version, headers, seq, createdAt, attempts, contentType, bin string, absent, nulls uint16) {
		vals := [...]string{id, aggType, aggID, typ, payload, occurredAt, version, headers, seq, createdAt, attempts, contentType, bin}
		cols := make(map[string]columnText, len(vals))
		for i, c := range textColumns {
			switch {
			case absent&(1<<i) != 0:
			case nulls&(1<<i) != 0:
				cols[c] = null
			default:
				cols[c] = text(vals[i])
			}
		}
		rec, err := decodeColumns(cols)
		again, err2 := decodeColumns(cols)
		if (err == nil) != (err2 == nil) || !sameRecord(rec, again) {
			t.Fatalf("two decodings differ: %+v, %v and %+v, %v", rec, err, again, err2)
		}
		if err != nil {
			typed := false
			for _, c := range []string{"occurred_at", "seq", "created_at", "attempts", "payload_binary"} {
				typed = typed || (cols[c].present && !cols[c].null)
			}
			if !typed {
				t.Fatalf("error %v, with no typed column given", err)
			}
			return
		}
		if c := cols["id"]; c.present && !c.null && rec.RawID != c.text {
			t.Fatalf("RawID %q, want the id column's text %q", rec.RawID, c.text)
		}
		if rec.Unreadable != nil {
			var u *driver.UnreadableError
			if !errors.As(rec.Unreadable, &u) || u.Seq != rec.Seq || len(u.Problems) == 0 || u.Error() == "" {
				t.Fatalf("unreadable %#v: want a *driver.UnreadableError of seq %d with its problems", rec.Unreadable, rec.Seq)
			}
			return
		}
		if u, err := idem.EventID(rec.RawID); err != nil || u != rec.ID {
			t.Fatalf("readable row with id %q: ID %v", rec.RawID, rec.ID)
		}
		checkOriginalID(t, rec)
		if h, err := outboxcodec.DecodeHeaders(rec.RawHeaders); err != nil || !maps.Equal(h, rec.Headers) {
			t.Fatalf("readable row with headers %q: %v, want %v", rec.RawHeaders, rec.Headers, h)
		}
	})
}

// FuzzDecodeLogMessage decodes arbitrary WAL message contents: it never
// panics, and a content it finds readable is encoded again by
// EncodeLogMessage into a content that decodes to the same event.
func FuzzDecodeLogMessage(f *testing.F) {
	id := uuid.NewString()
	base := `{"id":"` + id + `","aggregatetype":"order","aggregateid":"42","type":"order.order.placed.v1","payload":{"total":12.5}`
	for _, content := range []string{
		base + `}`,
		`{"id":"` + id + `","aggregatetype":"order","aggregateid":"42","type":"t","content_type":"application/x-protobuf","payload_base64":"AP8K"}`,
		`{"id":"` + id + `","aggregatetype":"order","aggregateid":"42","type":"t","content_type":"application/json","payload_base64":"AP8K"}`,
		`{"id":"` + id + `","aggregatetype":"order","aggregateid":"42","type":"t","content_type":"application/x-protobuf","payload":{}}`,
		base + `,"occurred_at":"2026-12-03T16:15:00.123456+00:00","aggregate_version":3,"headers":{"traceparent":"00-x"}}`,
		base + `,"occurred_at":"2026-12-03 16:15:00.123456+00"}`,
		base + `,"occurred_at":"2026-12-03 21:45:00.123456+05:30"}`,
		base + `,"occurred_at":"2026-12-03 16:15:00+00"}`,
		base + `,"occurred_at":"2026-12-03T16:15:00.123456+00"}`,
		base + `,"occurred_at":"2026-12-03 16:15:00"}`,
		base + `,"occurred_at":"yesterday"}`,
		base + `,"occurred_at":"0000-01-01T00:00:00+01:00"}`,
		base + `,"occurred_at":"9999-12-31 23:59:59-01"}`,
		`{"id":"x","type":"t"}`,
		`{"id":"","type":"t"}`,
		`[1,2]`,
		base + `,"headers":[1]}`,
		base + `,"headers":{"n":1,"o":{"a":null}}}`,
		base + `,"aggregate_version":"3"}`,
		base + `,"payload":null}`,
	} {
		f.Add([]byte(content))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		rec := outboxcodec.DecodeLogMessage(content)
		if rec.Unreadable != nil {
			if rec.Unreadable.Error() == "" {
				t.Fatal("an unreadable content without a problem")
			}
			return
		}
		if u, err := idem.EventID(rec.RawID); err != nil || u != rec.ID {
			t.Fatalf("readable content with id %q: ID %v", rec.RawID, rec.ID)
		}
		checkOriginalID(t, rec)
		again, err := outboxcodec.EncodeLogMessage(rec.OutboxRow)
		if err != nil {
			t.Fatalf("encode %+v again: %v", rec.OutboxRow, err)
		}
		back := outboxcodec.DecodeLogMessage(again)
		if back.Unreadable != nil || back.ID != rec.ID || back.AggregateType != rec.AggregateType ||
			back.AggregateID != rec.AggregateID || back.Type != rec.Type || back.AggregateVersion != rec.AggregateVersion ||
			!back.OccurredAt.Equal(rec.OccurredAt) || !maps.Equal(back.Headers, rec.Headers) ||
			back.ContentType != rec.ContentType || (idem.IsJSONContentType(rec.ContentType) && !sameJSON(back.Payload, rec.Payload)) ||
			(!idem.IsJSONContentType(rec.ContentType) && !bytes.Equal(back.Payload, rec.Payload)) {
			t.Fatalf("%s decodes to %+v; encoded again, %s decodes to %+v", content, rec, again, back)
		}
	})
}

// sameRecord compares two decodings of one row, their problems by text.
// checkOriginalID checks that the message of a readable record carries
// its id in idem.HeaderOriginalID exactly when the event id was derived
// from it.
func checkOriginalID(t *testing.T, rec driver.OutboxRecord) {
	t.Helper()
	msg, err := outboxcodec.Message(rec)
	if err != nil {
		return
	}
	got, ok := msg.Headers[idem.HeaderOriginalID]
	switch derived := idem.IsDerivedEventID(rec.RawID); {
	case msg.EventID != rec.ID:
		t.Fatalf("message of id %q: event id %v, want %v", rec.RawID, msg.EventID, rec.ID)
	case derived && got != rec.RawID:
		t.Fatalf("message of id %q: header %s = %q, want the id", rec.RawID, idem.HeaderOriginalID, got)
	case !derived && ok != (rec.Headers[idem.HeaderOriginalID] != ""):
		t.Fatalf("message of the UUID %q: header %s = %q, not the row's", rec.RawID, idem.HeaderOriginalID, got)
	}
}

func sameRecord(a, b driver.OutboxRecord) bool {
	ua, ub := a.Unreadable, b.Unreadable
	a.Unreadable, b.Unreadable = nil, nil
	if (ua == nil) != (ub == nil) || (ua != nil && ua.Error() != ub.Error()) {
		return false
	}
	return reflect.DeepEqual(a, b)
}

// sameJSON reports whether a and b are the same JSON value (or both nil).
func sameJSON(a, b json.RawMessage) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}
