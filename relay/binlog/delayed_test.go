package binlog_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
)

func wasPublished(msgs []idem.Message, id uuid.UUID) bool {
	for _, m := range msgs {
		if m.EventID == id {
			return true
		}
	}
	return false
}

// A delayed row is left in the table by the stream, whose stored position
// moves on; it holds back nothing of its aggregate; it survives a restart,
// also one that starts over from a snapshot, and the relay that holds the
// outbox publishes it once due, then deletes it.
func TestDelayedRowsHeldUntilDue(t *testing.T) {
	db := testdb.NewMariaDB(t)
	pub := memory.New()
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	cfg := fastConfig(t)
	cfg.DueInterval = 20 * time.Millisecond
	cfg.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	r := start(t, db, pub, cfg)
	// Past the first start's snapshot: the insert comes in the stream.
	eventually(t, "the relay streaming", func() bool { return r.Stats().Streaming })
	w := outbox.NewWriter(db.Driver)
	ctx := context.Background()

	due := time.Now().Add(time.Hour)
	d, err := idem.NewEvent("order.changed.v1", "order", "a", map[string]any{"version": 1})
	if err != nil {
		t.Fatal(err)
	}
	d.NotBefore = due
	if err := w.AddExec(ctx, db.Driver.Pool(), d); err != nil {
		t.Fatal(err)
	}
	// Sentinels committed after it: a2 of its aggregate, s1 of another.
	sentinels := append(add(t, db, "a", 2, 2), add(t, db, "s", 1, 1)...)
	waitLen(t, pub, 2)
	msgs := pub.Messages()
	if wasPublished(msgs, d.ID) {
		t.Fatal("the delayed event was published before its time")
	}
	for _, id := range sentinels {
		if !wasPublished(msgs, id) {
			t.Fatalf("sentinel %s not published", id)
		}
	}
	eventually(t, "the sentinels deleted", func() bool { return db.Count(t, "outbox") == 1 })
	if s := r.Stats(); s.Delayed != 1 || s.DuePublished != 0 {
		t.Errorf("stats = %+v, want 1 delayed, none published", s)
	}
	stop(t, r)

	// A relay that starts over from a snapshot leaves it too.
	if err := binlogReset(db); err != nil {
		t.Fatal(err)
	}
	r = start(t, db, pub, cfg)
	s2 := add(t, db, "s", 2, 2)
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := pub.Wait(ctx2, func(msgs []idem.Message, _ int) bool { return wasPublished(msgs, s2[0]) }); err != nil {
		t.Fatal(err)
	}
	if wasPublished(pub.Messages(), d.ID) {
		t.Fatal("the delayed event was published before its time after a restart")
	}
	stop(t, r)

	// Due, the next relay publishes it and deletes it.
	clock.Store(due.Add(time.Second).UnixNano())
	r = start(t, db, pub, cfg)
	if err := pub.Wait(ctx2, func(msgs []idem.Message, _ int) bool { return wasPublished(msgs, d.ID) }); err != nil {
		t.Fatalf("the delayed event was not published once due: %v", err)
	}
	eventually(t, "the delayed row deleted", func() bool { return db.Count(t, "outbox") == 0 })
	if s := r.Stats(); s.DuePublished != 1 {
		t.Errorf("stats = %+v, want 1 delayed row published", s)
	}
	// Archived with the delete, as the stream's rows: idem replay finds it.
	if n := db.Count(t, "outbox_archive WHERE id = '"+d.ID.String()+"'"); n != 1 {
		t.Errorf("the delayed event archived %d times, want once", n)
	}
}

// binlogReset forgets the stored position: the next start reads the rows
// waiting in a snapshot.
func binlogReset(db *testdb.SQLDB) error {
	_, err := db.DB.Exec(`DELETE FROM binlog_position`)
	return err
}
