package drivertest

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
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
// handled by a consumer with the same bytes, and read back as it is by
// replay; a JSON event with a content type keeps it, in the JSON column.
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
	// Another program's row with JSON under a content type that is not:
	// quarantined, saying so.
	db.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, content_type)
VALUES (?, 'order', 'mixed', 'order.order.placed.v1', '{"n": 1}', 'application/x-protobuf')`, uuid.NewString())
	mixed := seqOf(t, db, "mixed")

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

	// A consumer on the in-process broker: its handler sees the bytes.
	pub := memory.New()
	cons, err := inbox.New(db.Driver, inbox.Config{Name: "bin", Logger: quarantineConfig().Logger})
	fatalIf(t, err, "new consumer")
	var mu sync.Mutex
	handled := map[uuid.UUID]idem.Event{}
	cons.Handle(bin.Name, func(_ context.Context, _ TTx, ev idem.Event) error { // every event here is named so
		mu.Lock()
		defer mu.Unlock()
		handled[ev.ID] = ev
		return nil
	})
	sub, err := pub.NewSubscriber(memory.SubscriberConfig{Consumer: "bin"}, cons.DeliverBatch)
	fatalIf(t, err, "new subscriber")
	fatalIf(t, sub.Start(ctx), "start subscriber")
	t.Cleanup(func() { _ = sub.Stop(context.Background()) })
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
	fatalIf(t, pub.WaitPending(ctx, "bin"), "the consumer's queue drained")
	mu.Lock()
	for _, want := range []idem.Event{bin, empty, typed, plain} {
		got, ok := handled[want.ID]
		if !ok || got.ContentType != want.ContentType || (!want.IsJSON() && !bytes.Equal(got.Payload, want.Payload)) {
			t.Errorf("handled %s: %v, content type %q, payload %x; want %q, %x", want.AggregateID, ok, got.ContentType, got.Payload, want.ContentType, want.Payload)
		}
	}
	mu.Unlock()
	testsvc.WaitFor(t, 30*time.Second, "every row marked published", func() bool {
		return db.count(t, "outbox WHERE published_at IS NULL AND quarantined_at IS NULL") == 0
	})

	testsvc.WaitFor(t, 30*time.Second, "the mixed row quarantined", func() bool {
		return db.count(t, "outbox WHERE seq = ? AND quarantined_at IS NOT NULL", mixed) == 1
	})
	q, err := rd.GetQuarantined(ctx, pool, mixed)
	fatalIf(t, err, "get the quarantined row")
	if q.ContentType != "application/x-protobuf" || !strings.Contains(q.LastError, "payload is set with the content type") {
		t.Errorf("quarantined row: content type %q, error %q", q.ContentType, q.LastError)
	}

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
