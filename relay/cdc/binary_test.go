package cdc_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// TestBinaryPayload: events whose payload is not JSON, written as rows
// (bytea, which pgoutput sends as hex text) and as WAL messages (base64 in
// the message's JSON), are published with their content type and their
// bytes, every byte value 0x00 to 0xff exactly; the archive keeps them, and a
// replay publishes the same messages again.
func TestBinaryPayload(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	r := start(t, pg, pub, fastConfig(t))
	lw, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	tw := outbox.NewWriter(pg.Driver)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	binary := func(agg string) idem.Event {
		ev := event(t, agg, 1)
		ev.ContentType, ev.Payload = "application/x-protobuf", all
		return ev
	}
	ctx := context.Background()
	want := map[uuid.UUID]idem.Event{}
	for _, w := range []*outbox.Writer[pgx.Tx]{tw, lw} {
		evs := []idem.Event{binary("bin"), event(t, "json", 1)}
		evs[1].ContentType = "application/vnd.shop+json"
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Add(ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			want[ev.ID] = ev
		}
	}
	waitLen(t, pub, len(want), 20*time.Second)
	eventually(t, 10*time.Second, "every event archived", func() bool { return r.Stats().Archived == int64(len(want)) })
	check := func(what string, msgs []idem.Message) {
		t.Helper()
		if len(msgs) != len(want) {
			t.Fatalf("%s: %d messages, want %d", what, len(msgs), len(want))
		}
		for _, m := range msgs {
			ev := decode(t, m)
			w := want[ev.ID]
			if ev.ContentType != w.ContentType || (!w.IsJSON() && !bytes.Equal(ev.Payload, w.Payload)) {
				t.Errorf("%s: event %s: content type %q, payload %x; want %q, %x", what, ev.ID, ev.ContentType, ev.Payload, w.ContentType, w.Payload)
			}
		}
	}
	check("published", pub.Messages())
	if n := pg.Count(t, "outbox_archive WHERE payload IS NULL AND content_type = 'application/x-protobuf' AND payload_binary = $1", all); n != 2 {
		t.Errorf("the archive holds %d binary events, want 2", n)
	}
	replayed := memory.New()
	f := relay.ReplayFilter{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour)}
	if n, err := relay.Replay(ctx, pg.Driver, replayed, f, relay.ReplayOptions{}); err != nil || n != int64(len(want)) {
		t.Fatalf("Replay = %d, %v; want %d", n, err, len(want))
	}
	check("replayed", replayed.Messages())
}
