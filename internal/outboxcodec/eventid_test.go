package outboxcodec_test

import (
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
)

// An id that is not a UUID becomes the same message whether it comes as a
// row or as a WAL message: the derived event id (the golden values of
// idem's tests), the id in idem.HeaderOriginalID, the row's own headers
// kept, and a header of that name in the row replaced.
func TestTextIDs(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 64)
	for _, c := range []struct{ raw, want string }{
		{"E42", "3f240152-ed00-547c-b98c-d4d274c69d5e"},
		{long, "bb6d9666-3ef6-590e-9632-1774ea480355"},
	} {
		cols := fullRow(c.raw)
		cols["headers"] = text(`{"traceparent": "00-x", "idem-original-id": "forged"}`)
		row, err := decodeColumns(cols)
		if err != nil {
			t.Fatal(err)
		}
		wal := outboxcodec.DecodeLogMessage([]byte(`{"id":"` + c.raw + `","aggregatetype":"order","aggregateid":"42","type":"order.order.placed.v1",` +
			`"payload":{"total":12.5},"headers":{"traceparent":"00-x","idem-original-id":"forged"}}`))
		for name, rec := range map[string]driver.OutboxRecord{"row": row, "WAL message": wal} {
			if rec.Unreadable != nil || rec.RawID != c.raw || rec.ID.String() != c.want {
				t.Errorf("%s with id %q: raw %q, id %v, unreadable %v; want id %s", name, c.raw, rec.RawID, rec.ID, rec.Unreadable, c.want)
				continue
			}
			msg, err := outboxcodec.Message(rec)
			if err != nil {
				t.Fatalf("%s with id %q: %v", name, c.raw, err)
			}
			if msg.EventID.String() != c.want || msg.Headers[idem.HeaderOriginalID] != c.raw || msg.Headers["traceparent"] != "00-x" {
				t.Errorf("%s with id %q: message %s, headers %v", name, c.raw, msg.EventID, msg.Headers)
			}
			if rec.Headers[idem.HeaderOriginalID] != "forged" {
				t.Errorf("%s with id %q: the record's headers changed: %v", name, c.raw, rec.Headers)
			}
			ev, err := idem.Decode(msg)
			if err != nil || ev.ID.String() != c.want || ev.Headers[idem.HeaderOriginalID] != c.raw {
				t.Errorf("%s with id %q: decoded %+v, %v", name, c.raw, ev, err)
			}
		}
	}
}

// A UUID, in any spelling uuid.Parse reads, is the event id, without the
// header; a header of that name that the row holds is left as it is.
func TestUUIDIDsKeepTheirHeaders(t *testing.T) {
	t.Parallel()
	u := uuid.MustParse("0193a0e4-5b7c-7d7e-8f90-a1b2c3d4e5f6")
	for _, raw := range []string{u.String(), strings.ToUpper(u.String()), "{" + u.String() + "}", "urn:uuid:" + u.String(), strings.ReplaceAll(u.String(), "-", "")} {
		rec, err := decodeColumns(fullRow(raw))
		if err != nil || rec.Unreadable != nil || rec.ID != u {
			t.Fatalf("id %q: %+v, %v", raw, rec, err)
		}
		msg, err := outboxcodec.Message(rec)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := msg.Headers[idem.HeaderOriginalID]; ok || msg.EventID != u {
			t.Errorf("id %q: message %s with headers %v, want %s without %s", raw, msg.EventID, msg.Headers, u, idem.HeaderOriginalID)
		}
		cols := fullRow(raw)
		cols["headers"] = text(`{"idem-original-id": "E42"}`)
		rec, _ = decodeColumns(cols)
		if msg, err := outboxcodec.Message(rec); err != nil || msg.Headers[idem.HeaderOriginalID] != "E42" {
			t.Errorf("id %q with the header in the row: %v, %v", raw, msg.Headers, err)
		}
	}
}

// An id of 65 bytes (or empty) is unreadable, and the reason says why.
func TestUnreadableIDs(t *testing.T) {
	t.Parallel()
	tooLong := strings.Repeat("x", 65)
	for raw, problem := range map[string]string{
		tooLong: `id "` + tooLong + `" is 65 bytes long, more than 64: an event id is a UUID, or 1 to 64 bytes of UTF-8 text without control characters`,
		"":      `id "" is empty: an event id is a UUID, or 1 to 64 bytes`,
	} {
		rec, err := decodeColumns(fullRow(raw))
		if err != nil || rec.Unreadable == nil || rec.ID != uuid.Nil || !strings.Contains(rec.Unreadable.Error(), problem) {
			t.Errorf("row with id %q: %v, %v; want unreadable because %s", raw, rec.Unreadable, err, problem)
		}
		if _, err := outboxcodec.Message(rec); err == nil || !strings.HasPrefix(err.Error(), "idem: outbox row seq 17 cannot be published: ") {
			t.Errorf("message of the row with id %q: %v", raw, err)
		}
		wal := outboxcodec.DecodeLogMessage([]byte(`{"id":"` + raw + `","type":"t"}`))
		if wal.Unreadable == nil || !strings.Contains(wal.Unreadable.Error(), problem) {
			t.Errorf("WAL message with id %q: %v; want unreadable because %s", raw, wal.Unreadable, problem)
		}
	}
}
