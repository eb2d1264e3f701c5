package drivertest

import (
	"bytes"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testsvc"
)

// allBytes is a payload with every byte value, 0x00 to 0xff.
func allBytes() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// relayBinaryPayload: an event whose payload is not JSON is stored in
// payload_binary with its content type (payload stays NULL), claimed,
// published by the relay in an envelope that gives the same bytes back,
// and read back as it is by replay and quarantine; a JSON event with a
// content type keeps it, in the JSON column.
func relayBinaryPayload[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	rd := db.Driver.Dialect()
	pool := db.Driver.Pool()

	bin := placed(t, "bin")
	bin.ContentType, bin.Payload = "application/x-protobuf", allBytes()
	empty := placed(t, "empty")
	empty.ContentType, empty.Payload = "application/octet-stream", nil
	typed := placed(t, "typed")
	typed.ContentType = "application/vnd.shop.order+json"
	plain := placed(t, "plain")
	insert(t, db, bin, empty, typed, plain)

	if n := db.count(t, "outbox WHERE payload IS NULL AND payload_binary IS NOT NULL AND content_type = 'application/x-protobuf'"); n != 1 {
		t.Fatalf("%d rows with the bytes in payload_binary, want 1", n)
	}
	if n := db.count(t, "outbox WHERE payload IS NOT NULL AND payload_binary IS NULL AND content_type IS NULL"); n != 1 {
		t.Fatalf("%d JSON rows without a content type, want 1 (stored as before)", n)
	}
	var stored []byte
	db.queryRow(t, "SELECT payload_binary FROM outbox WHERE aggregateid = 'bin'", nil, &stored)
	if !bytes.Equal(stored, allBytes()) {
		t.Fatalf("payload_binary holds %x, want every byte value", stored)
	}

	pub := memory.New()
	startRelay(t, db, pub, quarantineConfig())
	fatalIf(t, waitPublished(ctx, pub, bin.ID, empty.ID, typed.ID, plain.ID), "the four events published")
	for _, m := range pub.Messages() {
		ev, err := idem.Decode(m)
		fatalIf(t, err, "decode %s", m.Body)
		var want idem.Event
		for _, e := range []idem.Event{bin, empty, typed, plain} {
			if e.ID == ev.ID {
				want = e
			}
		}
		switch {
		case ev.ContentType != want.ContentType:
			t.Errorf("%s: content type %q, want %q", ev.AggregateID, ev.ContentType, want.ContentType)
		case !want.IsJSON() && !bytes.Equal(ev.Payload, want.Payload):
			t.Errorf("%s: payload %x, want %x", ev.AggregateID, ev.Payload, want.Payload)
		case want.IsJSON() && !jsonEqual(ev.Payload, want.Payload):
			t.Errorf("%s: payload %s, want %s", ev.AggregateID, ev.Payload, want.Payload)
		}
	}
	testsvc.WaitFor(t, 30*time.Second, "every row marked published", func() bool {
		return db.count(t, "outbox WHERE published_at IS NULL") == 0
	})

	recs, err := rd.ReplayRows(ctx, pool, driver.ReplayFilter{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour)}, 0, 10)
	fatalIf(t, err, "replay rows")
	found := 0
	for _, r := range recs {
		if r.ID == bin.ID {
			found++
			if r.Unreadable != nil || r.ContentType != bin.ContentType || !bytes.Equal(r.Payload, bin.Payload) {
				t.Errorf("replayed binary row: %q %x %v", r.ContentType, r.Payload, r.Unreadable)
			}
		}
	}
	if found != 1 {
		t.Errorf("replay found the binary row %d times, want 1", found)
	}
}
