package cdc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/logrelay"
)

// wasPublished reports whether msgs hold id.
func wasPublished(msgs []idem.Message, id uuid.UUID) bool {
	for _, m := range msgs {
		if m.EventID == id {
			return true
		}
	}
	return false
}

// A delayed row is left in the table by the stream, whose position moves
// on; it holds back nothing of its aggregate; it survives a restart of the
// relay, and the relay that holds the slot publishes it once due, then
// deletes it.
func TestDelayedRowsHeldUntilDue(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	cfg := fastConfig(t)
	cfg.DueInterval = 20 * time.Millisecond
	cfg.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	r := start(t, pg, pub, cfg)
	w := outbox.NewWriter(pg.Driver)
	ctx := context.Background()

	due := time.Now().Add(time.Hour)
	d := event(t, "a", 1)
	d.NotBefore = due
	if err := w.AddExec(ctx, pg.Driver.Pool(), d); err != nil {
		t.Fatal(err)
	}
	// Sentinels committed after it: a2 of its aggregate, s1 of another.
	a2, s1 := event(t, "a", 2), event(t, "s", 1)
	if err := w.AddExec(ctx, pg.Driver.Pool(), a2, s1); err != nil {
		t.Fatal(err)
	}
	after := currentLSN(t, pg)
	waitLen(t, pub, 2, 20*time.Second)
	if wasPublished(pub.Messages(), d.ID) {
		t.Fatal("the delayed event was published before its time")
	}
	slot := cdc.SlotName(idem.Tables{Schema: pg.Schema})
	eventually(t, 20*time.Second, "the slot's position past the delayed row", func() bool { return confirmedLSN(t, pg, slot) >= after })
	if n := pg.Count(t, "outbox"); n != 1 {
		t.Fatalf("%d rows in the outbox, want the delayed one", n)
	}
	if s := r.Stats(); s.Delayed != 1 || s.DuePublished != 0 {
		t.Errorf("stats = %+v, want 1 delayed, none published", s)
	}

	// The relay stops before the time; the next one on the slot publishes
	// the row once due.
	stop(t, r)
	clock.Store(due.Add(time.Second).UnixNano())
	r2 := start(t, pg, pub, cfg)
	ctx2, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := pub.Wait(ctx2, func(msgs []idem.Message, _ int) bool { return wasPublished(msgs, d.ID) }); err != nil {
		t.Fatalf("the delayed event was not published once due: %v", err)
	}
	eventually(t, 10*time.Second, "the delayed row deleted", func() bool { return pg.Count(t, "outbox") == 0 })
	if s := r2.Stats(); s.DuePublished != 1 {
		t.Errorf("stats = %+v, want 1 delayed row published", s)
	}
	// Archived with the delete, as the stream's rows: idem replay finds it.
	if n := pg.Count(t, "outbox_archive WHERE id = '"+d.ID.String()+"'"); n != 1 {
		t.Errorf("the delayed event archived %d times, want once", n)
	}
}

// With KeepRows the relay marks a published delayed row instead of
// deleting it.
func TestDelayedRowsKeepRows(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	cfg := fastConfig(t)
	cfg.Delete = logrelay.KeepRows
	cfg.DueInterval = 20 * time.Millisecond
	start(t, pg, pub, cfg)
	d := event(t, "a", 1)
	d.NotBefore = time.Now().Add(time.Second)
	if err := outbox.NewWriter(pg.Driver).AddExec(context.Background(), pg.Driver.Pool(), d); err != nil {
		t.Fatal(err)
	}
	msgs := waitLen(t, pub, 1, 20*time.Second)
	if msgs[0].EventID != d.ID {
		t.Fatalf("published %v, want the delayed event", msgs[0].EventID)
	}
	if at := time.Now(); at.Before(d.NotBefore) {
		t.Fatalf("published %v before its time", d.NotBefore.Sub(at))
	}
	eventually(t, 10*time.Second, "the row marked published", func() bool {
		return pg.Count(t, "outbox WHERE published_at IS NOT NULL") == 1
	})
	if n := pg.Count(t, "outbox_archive WHERE id = '"+d.ID.String()+"'"); n != 1 {
		t.Errorf("the delayed event archived %d times, want once", n)
	}
}

// A relay abandoned while the broker holds a due delayed row's message
// (a crash between the publish and the delete, as far as the table can
// tell) leaves the row in the table: the next relay publishes it.
func TestDelayedRowSurvivesAnAbandonedPublish(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	hung := memory.New()
	hang := make(chan struct{})
	defer close(hang)
	hung.SetFunc(func(int, []idem.Message) memory.Action { return memory.Action{Hang: hang} })
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	cfg := fastConfig(t)
	cfg.PublishTimeout = time.Minute
	cfg.DueInterval = 20 * time.Millisecond
	cfg.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	r := start(t, pg, hung, cfg)
	d := event(t, "a", 1)
	d.NotBefore = time.Now().Add(time.Hour)
	if err := outbox.NewWriter(pg.Driver).AddExec(context.Background(), pg.Driver.Pool(), d); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the insert read", func() bool { return r.Stats().Delayed == 1 })
	clock.Store(d.NotBefore.Add(time.Second).UnixNano())
	eventually(t, 20*time.Second, "the due row handed to the broker", func() bool { return hung.Calls() > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_ = r.Stop(ctx) // nil, or its deadline: the publish is abandoned either way
	select {
	case <-r.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not end after its Stop ran out of time")
	}
	if n := pg.Count(t, "outbox"); n != 1 {
		t.Fatalf("%d rows in the outbox: the unconfirmed delayed row was deleted", n)
	}
	pub := memory.New()
	start(t, pg, pub, cfg)
	msgs := waitLen(t, pub, 1, 20*time.Second)
	if msgs[0].EventID != d.ID {
		t.Fatalf("published %s, want the delayed event", msgs[0].EventID)
	}
	eventually(t, 10*time.Second, "the delayed row deleted", func() bool { return pg.Count(t, "outbox") == 0 })
}
