package cdc_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/outbox"
)

// TestRefusedBinaryQuarantined: an event whose payload is not JSON, as a
// table row and as a WAL message, refused by the broker on every attempt,
// is quarantined with its content type and its bytes as they were; re-driven,
// it is published with both, byte for byte.
func TestRefusedBinaryQuarantined(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	var mu sync.Mutex
	refuse := map[uuid.UUID]bool{}
	pub.SetFunc(func(int, []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if refuse[m.EventID] {
				return fmt.Errorf("no binding: %w", broker.ErrUnroutable)
			}
			return nil
		}}
	})
	cfg := fastConfig(t)
	cfg.QuarantineAfter = 2
	start(t, pg, pub, cfg)

	payload := make([]byte, 256)
	for i := range payload {
		payload[i] = byte(i)
	}
	binary := func(agg string) idem.Event {
		ev := event(t, agg, 1)
		ev.ContentType, ev.Payload = "application/x-protobuf", append([]byte(nil), payload...)
		return ev
	}
	row, wal := binary("row"), binary("wal")
	mu.Lock()
	refuse[row.ID], refuse[wal.ID] = true, true
	mu.Unlock()
	lw, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sentinel := event(t, "sentinel", 1)
	if err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
		if err := outbox.NewWriter(pg.Driver).Add(ctx, tx, row, sentinel); err != nil {
			return err
		}
		return lw.Add(ctx, tx, wal)
	}); err != nil {
		t.Fatal(err)
	}
	waitLen(t, pub, 1, 20*time.Second)
	eventually(t, 20*time.Second, "both quarantined", func() bool {
		return pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL") == 2
	})
	if n := pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL AND content_type = 'application/x-protobuf' AND payload IS NULL AND payload_binary = $1", payload); n != 2 {
		t.Fatalf("%d quarantined rows keep the content type and the bytes, want 2", n)
	}
	q, err := pg.Driver.Dialect().ListQuarantined(ctx, pg.Driver.Pool(), driver.QuarantineFilter{Limit: 10})
	if err != nil || len(q) != 2 {
		t.Fatalf("ListQuarantined: %d rows, %v", len(q), err)
	}
	seqs := []int64{q[0].Seq, q[1].Seq}

	mu.Lock()
	clear(refuse)
	mu.Unlock()
	if n, err := pg.Driver.Dialect().RequeueQuarantined(ctx, pg.Driver.Pool(), seqs); err != nil || n != 2 {
		t.Fatalf("requeue = %d, %v", n, err)
	}
	msgs := waitLen(t, pub, 3, 20*time.Second)
	for _, m := range msgs[1:] {
		ev, err := idem.Decode(m)
		if err != nil {
			t.Fatalf("decode the re-driven %s: %v", m.EventID, err)
		}
		if (ev.ID != row.ID && ev.ID != wal.ID) || ev.ContentType != "application/x-protobuf" || !bytes.Equal(ev.Payload, payload) {
			t.Errorf("re-driven %s: content type %q, %d bytes equal %v", ev.ID, ev.ContentType, len(ev.Payload), bytes.Equal(ev.Payload, payload))
		}
	}
	eventually(t, 10*time.Second, "the outbox emptied", func() bool { return pg.Count(t, "outbox") == 0 })
}
