package drivertest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testsvc"
)

// delayed returns an event of aggregate order/aggregate due at at.
func delayed(t testing.TB, aggregate string, version int, at time.Time) idem.Event {
	ev := changed(t, aggregate, version)
	ev.NotBefore = at
	return ev
}

// Delayed checks delayed rows (idem.Event.NotBefore): the claim takes none
// before its time (the claim's clock is ClaimParams.Now, so no check waits
// for a real delay), a delayed row holds back nothing of its aggregate,
// once due it goes as its aggregate's head, the backlog and the status
// count it as scheduled, and a running relay publishes it at its time.
func Delayed[TTx any](t *testing.T, setup Setup[TTx]) {
	t.Run("Claim", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		rd := db.Driver.Dialect()
		ctx := testsvc.Ctx(t, 30*time.Second)
		pool := db.Driver.Pool()
		now := time.Now()
		due := now.Add(time.Hour)
		a1, a2, a3 := changed(t, "a", 1), delayed(t, "a", 2, due), changed(t, "a", 3)
		b1 := delayed(t, "b", 1, due.Add(time.Minute))
		past := delayed(t, "c", 1, now.Add(-time.Hour)) // due already: stored as undelayed
		insert(t, db, a1, a2, a3, b1, past)
		if n := db.count(t, "outbox WHERE not_before IS NOT NULL"); n != 2 {
			t.Fatalf("%d rows stored with not_before, want the 2 delayed ones", n)
		}

		// Before its time a delayed row is not claimed, and a3 after it
		// goes with a1: it holds nothing back.
		owner := uuid.New()
		first := claimWith(t, db, rd, driver.ClaimParams{Owner: owner, Lease: time.Minute, Limit: 10, MaxPerAggregate: 10, Now: now})
		if !sameIDs(claimedIDs(first), a1, a3, past) {
			t.Fatalf("claim before the due time = %v, want a1, a3, c1 (not a2, b1)", claimedIDs(first))
		}
		b, err := rd.OutboxBacklog(ctx, pool)
		fatalIf(t, err, "backlog")
		if b.Rows != 3 || b.Scheduled != 2 || !b.NextDue.Equal(due.UTC().Truncate(time.Microsecond)) {
			t.Errorf("backlog = %+v, want 3 rows waiting, 2 scheduled, next due %v", b, due)
		}
		next, err := rd.NextDue(ctx, pool)
		fatalIf(t, err, "next due")
		if !next.Equal(due.UTC().Truncate(time.Microsecond)) {
			t.Errorf("NextDue = %v, want %v", next, due)
		}
		st, err := rd.ReadStatus(ctx, pool, driver.StatusParams{})
		fatalIf(t, err, "status")
		if st.Outbox.Backlog != 3 || st.Outbox.Scheduled != 2 || !st.Outbox.NextDue.Equal(due.UTC().Truncate(time.Microsecond)) {
			t.Errorf("status outbox = %+v, want backlog 3, 2 scheduled, next due %v", st.Outbox, due)
		}

		// Due, a2 is its aggregate's head, but a3 after it is leased: it
		// waits until a3 is settled. b1 goes.
		later := due.Add(2 * time.Minute)
		rows := claimWith(t, db, rd, driver.ClaimParams{Owner: uuid.New(), Lease: time.Minute, Limit: 10, MaxPerAggregate: 10, Now: later})
		if !sameIDs(claimedIDs(rows), b1) {
			t.Fatalf("claim once due, a3 leased = %v, want b1 only", claimedIDs(rows))
		}
		// It has waited since its due time.
		if want := b1.NotBefore.UTC().Truncate(time.Microsecond); !rows[0].CreatedAt.Equal(want) {
			t.Errorf("b1's created_at once claimed = %v, want its due time %v", rows[0].CreatedAt, want)
		}
		if n := db.count(t, "outbox WHERE not_before IS NOT NULL"); n != 0 {
			t.Errorf("%d rows keep not_before once due and claimed, want 0", n)
		}
		n, err := rd.MarkPublished(ctx, pool, owner, claimedSeqs(first))
		fatalIf(t, err, "mark")
		if n != 3 {
			t.Fatalf("marked %d rows, want 3", n)
		}
		rows = claimWith(t, db, rd, driver.ClaimParams{Owner: uuid.New(), Lease: time.Minute, Limit: 10, MaxPerAggregate: 10, Now: later})
		if !sameIDs(claimedIDs(rows), a2) {
			t.Fatalf("claim once due and a3 published = %v, want a2", claimedIDs(rows))
		}
		b, err = rd.OutboxBacklog(ctx, pool)
		fatalIf(t, err, "backlog")
		if b.Rows != 2 || b.Scheduled != 0 || !b.NextDue.IsZero() {
			t.Errorf("backlog once due = %+v, want 2 rows waiting (leased), none scheduled", b)
		}
	})

	t.Run("DueByTheDatabaseClockInTheStatus", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		rd := db.Driver.Dialect()
		ctx := testsvc.Ctx(t, 30*time.Second)
		pool := db.Driver.Pool()
		// A delayed row whose time passed before a relay claimed it counts
		// as waiting since its due time.
		ev := delayed(t, "d", 1, time.Now().Add(time.Hour))
		insert(t, db, ev)
		past := time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond)
		db.exec(t, "UPDATE outbox SET not_before = ?", db.timeArg(past))
		st, err := rd.ReadStatus(ctx, pool, driver.StatusParams{})
		fatalIf(t, err, "status")
		if st.Outbox.Backlog != 1 || st.Outbox.Scheduled != 0 || !st.Outbox.OldestUnpublished.Equal(past) {
			t.Errorf("status outbox = %+v, want 1 waiting since %v, none scheduled", st.Outbox, past)
		}
	})

	t.Run("RelayPublishesWhenDue", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		pub := memory.New()
		var clock atomic.Int64
		start := time.Now()
		clock.Store(start.UnixNano())
		cfg := quarantineConfig()
		cfg.Now = func() time.Time { return time.Unix(0, clock.Load()) }
		startRelay(t, db, pub, cfg)
		ctx := testsvc.Ctx(t, 60*time.Second)

		due := start.Add(time.Hour)
		d := delayed(t, "a", 1, due)
		insert(t, db, d)
		// The sentinels, written after it: a2 of its aggregate, and s1 of
		// another. Once they are published, the relay has claimed after
		// the delayed row was committed.
		a2, s1 := changed(t, "a", 2), changed(t, "s", 1)
		insert(t, db, a2, s1)
		fatalIf(t, waitPublished(ctx, pub, a2.ID, s1.ID), "wait for the sentinels")
		for _, m := range pub.Messages() {
			if m.EventID == d.ID {
				t.Fatalf("the delayed event was published before its time")
			}
		}
		clock.Store(due.Add(time.Second).UnixNano())
		fatalIf(t, waitPublished(ctx, pub, d.ID), "wait for the delayed event once due")
	})

	t.Run("RelayWakesUpWhenDue", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		pub := memory.New()
		cfg := quarantineConfig()
		// An idle relay backs off to a minute between polls: the row due
		// in a few seconds is claimed at its time all the same.
		cfg.Workers, cfg.PollInterval, cfg.MaxPollInterval = 1, 20*time.Millisecond, time.Minute
		r := startRelay(t, db, pub, cfg)
		ctx := testsvc.Ctx(t, 60*time.Second)
		s1 := changed(t, "s", 1)
		insert(t, db, s1)
		fatalIf(t, waitPublished(ctx, pub, s1.ID), "wait for the first event")
		// Eight polls that found nothing: the relay now waits 5.12 s
		// between polls, and 10.24 s after the next.
		empty := r.Stats().EmptyClaims
		testsvc.WaitFor(t, 30*time.Second, "the relay backing off", func() bool { return r.Stats().EmptyClaims >= empty+8 })
		due := time.Now().Add(3 * time.Second)
		d := delayed(t, "a", 1, due)
		insert(t, db, d)
		r.Notify() // as a producer in the relay's process does after its commit
		fatalIf(t, waitPublished(ctx, pub, d.ID), "wait for the delayed event")
		at := time.Now()
		if at.Before(due) {
			t.Fatalf("the delayed event was published %v before its time", due.Sub(at))
		}
		// Within a poll interval of its time, give or take a loaded
		// machine; a relay that did not look for its time would poll
		// next more than 5 s later.
		if late := at.Sub(due); late > 2*time.Second {
			t.Errorf("the delayed event was published %v after its time", late)
		}
	})
}
