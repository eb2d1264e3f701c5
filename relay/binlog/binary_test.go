package binlog_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// TestBinaryPayload: events whose payload is not JSON, in the outbox's
// LONGBLOB column, are published with their content type and their bytes,
// every byte value 0x00 to 0xff exactly, whether the relay finds the row
// waiting at its first start or in the binlog; the archive keeps them, and a
// replay publishes the same messages again.
func TestBinaryPayload(t *testing.T) {
	db := testdb.NewMariaDB(t)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	want := map[uuid.UUID]idem.Event{}
	write := func(agg string) {
		t.Helper()
		bin, err := idem.NewEvent("order.changed.v1", "order", agg, nil)
		if err != nil {
			t.Fatal(err)
		}
		bin.ContentType, bin.Payload = "application/x-protobuf", all
		js, err := idem.NewEvent("order.changed.v1", "order", agg+"-json", map[string]int{"n": 1})
		if err != nil {
			t.Fatal(err)
		}
		js.ContentType = "application/vnd.shop+json"
		if err := outbox.NewWriter(db.Driver).AddExec(context.Background(), db.Driver.Pool(), bin, js); err != nil {
			t.Fatal(err)
		}
		want[bin.ID], want[js.ID] = bin, js
	}
	write("waiting")
	pub := memory.New()
	r := start(t, db, pub, fastConfig(t))
	write("streamed")
	msgs := waitLen(t, pub, len(want))
	eventually(t, "every event archived", func() bool { return r.Stats().Archived == int64(len(want)) })
	check := func(what string, msgs []idem.Message) {
		t.Helper()
		if len(msgs) != len(want) {
			t.Fatalf("%s: %d messages, want %d", what, len(msgs), len(want))
		}
		for _, m := range msgs {
			ev, err := idem.Decode(m)
			if err != nil {
				t.Fatal(err)
			}
			w := want[ev.ID]
			if ev.ContentType != w.ContentType || (!w.IsJSON() && !bytes.Equal(ev.Payload, w.Payload)) {
				t.Errorf("%s: event %s: content type %q, payload %x; want %q, %x", what, ev.ID, ev.ContentType, ev.Payload, w.ContentType, w.Payload)
			}
		}
	}
	check("published", msgs)
	if n := db.Count(t, "outbox_archive WHERE payload IS NULL AND content_type = 'application/x-protobuf' AND payload_binary = ?", all); n != 2 {
		t.Errorf("the archive holds %d binary events, want 2", n)
	}
	replayed := memory.New()
	f := relay.ReplayFilter{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour)}
	if n, err := relay.Replay(context.Background(), db.Driver, replayed, f, relay.ReplayOptions{}); err != nil || n != int64(len(want)) {
		t.Fatalf("Replay = %d, %v; want %d", n, err, len(want))
	}
	check("replayed", replayed.Messages())
}
