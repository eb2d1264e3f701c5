package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// pausedReplica returns a consumer named "shipping" on pg, on clock, whose
// handler counts its calls in *calls.
func pausedReplica(t *testing.T, pg *testdb.PG, clock *idemtest.Clock, calls *int) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	c, err := inbox.New(pg.Driver, inbox.Config{Name: "shipping", PauseCheck: time.Second, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(context.Context, pgx.Tx, idem.Event) error { *calls++; return nil })
	return c
}

func deliverOne(t *testing.T, c *inbox.Consumer[pgx.Tx], orderID string) inbox.Disposition {
	t.Helper()
	m, err := idem.NewMessage(placed(t, orderID))
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Deliver(testsvc.Ctx(t, 30*time.Second), inbox.Delivery{Message: m, Source: "shipping.events", Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestPauseReplicasAndUntil: a pause recorded in the consumer's database
// reaches two replicas (two consumers of the same name) once their
// PauseCheck has passed on their clock, hands back without calling the
// handler or counting an attempt, tells how long until it is read again,
// and a pause until a time ends by itself at that time.
func TestPauseReplicasAndUntil(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	clock := idemtest.NewClock()
	var callsA, callsB int
	a, b := pausedReplica(t, pg, clock, &callsA), pausedReplica(t, pg, clock, &callsB)
	if d := deliverOne(t, a, "1"); d.Action != inbox.Ack || d.Outcome != inbox.Applied {
		t.Fatalf("before the pause: %v/%v, want ack/applied", d.Action, d.Outcome)
	}
	deliverOne(t, b, "2")

	ctx := testsvc.Ctx(t, 30*time.Second)
	until := clock.Now().Add(2 * time.Hour)
	if err := inbox.NewPauseStore(pg.Driver).Pause(ctx, "shipping", idem.Pause{Until: until, Reason: "carrier maintenance", By: "ops"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second) // PauseCheck: both read it at their next delivery
	for _, r := range []*inbox.Consumer[pgx.Tx]{a, b} {
		d := deliverOne(t, r, "3")
		if d.Action != inbox.Pause || d.Outcome != inbox.Paused || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
			t.Errorf("while paused: %v/%v after %v, want pause/paused after at most PauseCheck", d.Action, d.Outcome, d.RetryAfter)
		}
		if st := r.Stats(); st.OperatorPaused != 1 || !st.OperatorPause.Until.Equal(until) || st.OperatorPause.By != "ops" {
			t.Errorf("stats while paused: %+v, want one hand-back and the pause", st)
		}
	}
	if callsA != 1 || callsB != 1 {
		t.Errorf("handler calls %d and %d, want 1 each: nothing applied while paused", callsA, callsB)
	}
	if n := pg.Count(t, "delivery_attempt"); n != 0 {
		t.Errorf("delivery_attempt rows: %d, want 0", n)
	}

	// An hour and a half later, still paused; at the end, it ends by itself.
	clock.Advance(90 * time.Minute)
	if d := deliverOne(t, a, "3"); d.Action != inbox.Pause {
		t.Errorf("before the pause's end: %v, want pause", d.Action)
	}
	clock.Set(until.Add(-time.Millisecond))
	if d := deliverOne(t, a, "3"); d.Action != inbox.Pause || d.RetryAfter != time.Millisecond {
		t.Errorf("a millisecond before the pause's end: %v after %v, want pause after 1ms", d.Action, d.RetryAfter)
	}
	clock.Set(until)
	if d := deliverOne(t, a, "3"); d.Action != inbox.Ack || d.Outcome != inbox.Applied {
		t.Errorf("at the pause's end: %v/%v, want ack/applied with no resume", d.Action, d.Outcome)
	}
	if st := a.Stats(); st.OperatorPause.Kind != "" {
		t.Errorf("stats after the pause's end: %+v, want no pause", st.OperatorPause)
	}
}

// TestPauseScheduled: a pause from a time to a time (a carrier's
// maintenance window) lets messages through before it, hands them back
// during it, and lets them through after it; a resume ends it early.
func TestPauseScheduled(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	clock := idemtest.NewClock()
	var calls int
	c := pausedReplica(t, pg, clock, &calls)
	ctx := testsvc.Ctx(t, 30*time.Second)
	from := clock.Now().Add(time.Hour)
	store := c.Pauses()
	if err := store.Pause(ctx, "shipping", idem.Pause{From: from, Until: from.Add(2 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := store.Pause(ctx, "shipping", idem.Pause{From: from, Until: from}); err == nil {
		t.Error("a pause until its start was accepted")
	}
	if d := deliverOne(t, c, "1"); d.Action != inbox.Ack {
		t.Errorf("before the window: %v, want ack", d.Action)
	}
	clock.Set(from)
	if d := deliverOne(t, c, "2"); d.Action != inbox.Pause {
		t.Errorf("in the window: %v, want pause", d.Action)
	}
	if ok, err := store.Resume(ctx, "shipping"); err != nil || !ok {
		t.Fatalf("Resume = %v, %v", ok, err)
	}
	clock.Advance(time.Second)
	if d := deliverOne(t, c, "2"); d.Action != inbox.Ack {
		t.Errorf("after the resume: %v, want ack", d.Action)
	}
	if ps, err := store.List(ctx); err != nil || len(ps) != 0 {
		t.Errorf("pauses after the resume: %v, %v; want none", ps, err)
	}
	if calls != 2 {
		t.Errorf("handler calls %d, want 2", calls)
	}
}
