package cdc_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
)

// TestTextIDs: another program's outbox, as Debezium's article has it (id
// VARCHAR(64), events called E42), and WAL messages with such ids: each id
// of 1 to 64 bytes is published under the UUID idem.EventID derives, with
// the id in the header idem-original-id, as the polling relay does, and
// its row deleted; a 65-byte id is quarantined, saying why; a WAL message
// with such an id that the broker refuses is parked as a row that,
// re-driven, publishes the same message.
func TestTextIDs(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pg.Exec(t, `ALTER TABLE outbox ALTER COLUMN id TYPE varchar(64)`)
	const refused = "E-wal-refused"
	refusedID, err := idem.EventID(refused)
	if err != nil {
		t.Fatal(err)
	}
	var refusing atomic.Bool
	refusing.Store(true)
	pub := memory.New()
	pub.SetFunc(func(int, []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			if m.EventID == refusedID && refusing.Load() {
				return fmt.Errorf("no binding: %w", broker.ErrUnroutable)
			}
			return nil
		}}
	})
	cfg := fastConfig(t)
	cfg.QuarantineAfter = 2
	r := start(t, pg, pub, cfg)

	want := map[uuid.UUID]string{} // event id: original id
	derive := func(raw string) {
		t.Helper()
		id, err := idem.EventID(raw)
		if err != nil {
			t.Fatal(err)
		}
		want[id] = raw
	}
	for agg, id := range map[string]string{"e42": "E42", "long": strings.Repeat("x", 64)} {
		pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'order.order.placed.v1', '{}')`, id, agg)
		derive(id)
	}
	// 65 bytes in 64 characters, which the column takes.
	tooLong := strings.Repeat("x", 63) + "\u00e9"
	pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'too-long', 'order.order.placed.v1', '{}')`, tooLong)
	for agg, id := range map[string]string{"w42": "W42", "wal-refused": refused} {
		pg.Exec(t, `SELECT pg_logical_emit_message(true, $1, json_build_object('id', $2::text, 'aggregatetype', 'order', 'aggregateid', $3::text,
			'type', 'order.order.placed.v1', 'payload', json_build_object('total', 1), 'headers', json_build_object('trace', 't-1'))::text)`,
			pg.Schema, id, agg)
	}
	derive("W42")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.Wait(ctx, func(msgs []idem.Message, _ int) bool { return distinctIn(msgs, want) == len(want) }); err != nil {
		t.Fatalf("waiting for the events with text ids: %v", err)
	}
	eventually(t, 20*time.Second, "the 65-byte id and the refused WAL message quarantined", func() bool {
		return pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL") == 2
	})
	streamedPast(t, pg, "the position confirmed past every row and message")
	if n := pg.Count(t, "outbox"); n != 2 {
		t.Fatalf("%d rows in the outbox, want the 2 quarantined: the published rows deleted by their text ids", n)
	}
	q, err := pg.Driver.Dialect().ListQuarantined(ctx, pg.Driver.Pool(), driver.QuarantineFilter{Limit: 10})
	if err != nil || len(q) != 2 {
		t.Fatalf("quarantined %+v, %v; want 2 rows", q, err)
	}
	var parked int64
	for _, row := range q {
		switch row.AggregateID {
		case "too-long":
			if row.RawID != tooLong || row.ID != uuid.Nil || !strings.Contains(row.LastError, "is 65 bytes long, more than 64") {
				t.Errorf("quarantined 65-byte id: raw %q, id %v, error %q", row.RawID, row.ID, row.LastError)
			}
		case "wal-refused":
			// Parked under its event id, with the original id in its headers.
			if row.RawID != refusedID.String() || row.Headers[idem.HeaderOriginalID] != refused || row.Headers["trace"] != "t-1" ||
				!strings.Contains(row.LastError, "unroutable") {
				t.Errorf("parked WAL message: raw id %q, headers %v, error %q", row.RawID, row.Headers, row.LastError)
			}
			parked = row.Seq
		default:
			t.Errorf("quarantined %+v", row)
		}
	}

	// Re-driven, the parked message goes as it would have gone.
	refusing.Store(false)
	if n, err := pg.Driver.Dialect().RequeueQuarantined(ctx, pg.Driver.Pool(), []int64{parked}); err != nil || n != 1 {
		t.Fatalf("requeue = %d, %v", n, err)
	}
	want[refusedID] = refused
	if err := pub.Wait(ctx, func(msgs []idem.Message, _ int) bool { return distinctIn(msgs, want) == len(want) }); err != nil {
		t.Fatalf("waiting for the re-driven message: %v", err)
	}
	for _, m := range pub.Messages() {
		raw, ok := want[m.EventID]
		if !ok {
			t.Errorf("published %s, not one of the text ids", m.EventID)
			continue
		}
		if m.Headers[idem.HeaderOriginalID] != raw {
			t.Errorf("event %s: header %s = %q, want %q", m.EventID, idem.HeaderOriginalID, m.Headers[idem.HeaderOriginalID], raw)
		}
		ev, err := idem.Decode(m)
		if err != nil || ev.ID != m.EventID {
			t.Errorf("event %s decoded as %+v, %v", m.EventID, ev, err)
		}
	}
	if s := r.Stats(); s.Quarantined != 2 || s.Unreadable != 1 {
		t.Errorf("stats %+v, want 2 quarantined of which 1 unreadable", s)
	}
}

// distinctIn counts the events of want among msgs.
func distinctIn(msgs []idem.Message, want map[uuid.UUID]string) int {
	seen := map[uuid.UUID]bool{}
	for _, m := range msgs {
		if _, ok := want[m.EventID]; ok {
			seen[m.EventID] = true
		}
	}
	return len(seen)
}
