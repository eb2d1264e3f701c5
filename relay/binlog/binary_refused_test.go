package binlog_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
)

// TestRefusedBinaryQuarantined: a row whose payload is not JSON, refused by
// the broker on every attempt, is quarantined with its content type and its
// bytes as they were; re-driven, it is published with both, byte for byte.
func TestRefusedBinaryQuarantined(t *testing.T) {
	db := testdb.NewMariaDB(t)
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
	r := start(t, db, pub, cfg)
	eventually(t, "streaming", func() bool { return r.Stats().Streaming })

	payload := make([]byte, 256)
	for i := range payload {
		payload[i] = byte(i)
	}
	ev, err := idem.NewEvent("order.changed.v1", "order", "bin", nil)
	if err != nil {
		t.Fatal(err)
	}
	ev.ContentType, ev.Payload = "application/x-protobuf", append([]byte(nil), payload...)
	mu.Lock()
	refuse[ev.ID] = true
	mu.Unlock()
	ctx := context.Background()
	if err := outbox.NewWriter(db.Driver).AddExec(ctx, db.Driver.Pool(), ev); err != nil {
		t.Fatal(err)
	}
	sentinel := add(t, db, "sentinel", 1, 1)
	waitLen(t, pub, 1)
	if pub.Messages()[0].EventID != sentinel[0] {
		t.Fatalf("published %v, want the sentinel", pub.Messages()[0].EventID)
	}
	eventually(t, "quarantined", func() bool { return db.Count(t, "outbox WHERE quarantined_at IS NOT NULL") == 1 })
	if n := db.Count(t, "outbox WHERE quarantined_at IS NOT NULL AND content_type = 'application/x-protobuf' AND payload IS NULL AND payload_binary = ?", payload); n != 1 {
		t.Fatalf("%d quarantined rows keep the content type and the bytes, want 1", n)
	}
	q, err := db.Driver.Dialect().ListQuarantined(ctx, db.Driver.Pool(), driver.QuarantineFilter{Limit: 10})
	if err != nil || len(q) != 1 {
		t.Fatalf("ListQuarantined: %d rows, %v", len(q), err)
	}

	mu.Lock()
	clear(refuse)
	mu.Unlock()
	if n, err := db.Driver.Dialect().RequeueQuarantined(ctx, db.Driver.Pool(), []int64{q[0].Seq}); err != nil || n != 1 {
		t.Fatalf("requeue = %d, %v", n, err)
	}
	msgs := waitLen(t, pub, 2)
	got, err := idem.Decode(msgs[1])
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != ev.ID || got.ContentType != "application/x-protobuf" || !bytes.Equal(got.Payload, payload) {
		t.Errorf("re-driven %s: content type %q, %d bytes, equal %v", got.ID, got.ContentType, len(got.Payload), bytes.Equal(got.Payload, payload))
	}
}
