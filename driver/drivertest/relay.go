package drivertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

func relayDialect(t *testing.T, db *DB) driver.RelayDialect {
	t.Helper()
	rd, ok := db.Driver.Dialect().(driver.RelayDialect)
	if !ok {
		t.Fatalf("%T does not implement driver.RelayDialect", db.Driver.Dialect())
	}
	return rd
}

// claim runs ClaimOutbox in its own transaction and commits, or claims
// through db.Claimer.
func claim(t *testing.T, db *DB, rd driver.RelayDialect, owner uuid.UUID, lease time.Duration, limit, perAggregate int) []driver.ClaimedRow {
	t.Helper()
	return claimWith(t, db, rd, driver.ClaimParams{Owner: owner, Lease: lease, Limit: limit, MaxPerAggregate: perAggregate})
}

func claimWith(t *testing.T, db *DB, rd driver.RelayDialect, p driver.ClaimParams) []driver.ClaimedRow {
	t.Helper()
	ctx := testsvc.Ctx(t, 30*time.Second)
	if db.Claimer != nil {
		rows, err := db.Claimer.ClaimOutbox(ctx, p)
		fatalIf(t, err, "claim")
		return rows
	}
	tx, err := db.Driver.Begin(ctx)
	fatalIf(t, err, "begin")
	defer rollback(tx)
	rows, err := rd.ClaimOutbox(ctx, db.Driver.Tx(tx), p)
	fatalIf(t, err, "claim")
	fatalIf(t, db.Driver.Commit(ctx, tx), "commit claim")
	return rows
}

func insert(t *testing.T, db *DB, events ...idem.Event) {
	t.Helper()
	fatalIf(t, outbox.NewWriter(db.Driver).AddExec(context.Background(), db.Driver.Pool(), events...), "insert")
}

func claimedIDs(rows []driver.ClaimedRow) []uuid.UUID {
	out := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func claimedSeqs(rows []driver.ClaimedRow) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.Seq
	}
	return out
}

func sameIDs(got []uuid.UUID, want ...idem.Event) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i].ID {
			return false
		}
	}
	return true
}

// Relay checks the relay's dialect operations and a running relay.
func Relay(t *testing.T, setup Setup) {
	t.Run("ClaimHeadsOnly", func(t *testing.T) {
		t.Parallel()
		db := setup(t, Options{})
		rd := relayDialect(t, db)
		a1, a2, a3, b1 := changed(t, "a", 1), changed(t, "a", 2), changed(t, "a", 3), changed(t, "b", 1)
		insert(t, db, a1, a2, a3, b1)

		// Heads only, in seq order.
		first := claim(t, db, rd, uuid.New(), time.Minute, 10, 1)
		if !sameIDs(claimedIDs(first), a1, b1) {
			t.Fatalf("claim with one row per aggregate = %v, want the heads a1, b1", claimedIDs(first))
		}
		for _, r := range first {
			if r.TakenOver || r.Attempts != 0 {
				t.Errorf("fresh row %v: taken over %v, attempts %d", r.ID, r.TakenOver, r.Attempts)
			}
		}
		// Aggregates with leased rows are not claimed again.
		if again := claim(t, db, rd, uuid.New(), time.Minute, 10, 10); len(again) != 0 {
			t.Fatalf("claimed %d rows of aggregates under lease", len(again))
		}
	})

	t.Run("ClaimFollowersAndLimit", func(t *testing.T) {
		t.Parallel()
		db := setup(t, Options{})
		rd := relayDialect(t, db)
		a1, a2, a3, b1, b2 := changed(t, "a", 1), changed(t, "a", 2), changed(t, "a", 3), changed(t, "b", 1), changed(t, "b", 2)
		insert(t, db, a1, b1, a2, b2, a3)
		rows := claim(t, db, rd, uuid.New(), time.Minute, 4, 10)
		// Two heads, then one follower each (room 2 shared by 2 aggregates).
		if !sameIDs(claimedIDs(rows), a1, b1, a2, b2) {
			t.Fatalf("claim = %v, want a1, b1, a2, b2 in seq order", claimedIDs(rows))
		}
		for i := 1; i < len(rows); i++ {
			if rows[i].Seq <= rows[i-1].Seq {
				t.Fatalf("rows not in seq order: %d then %d", rows[i-1].Seq, rows[i].Seq)
			}
		}
		if rows[0].Payload == nil || rows[0].Type != a1.Name || rows[0].AggregateID != "a" || rows[0].AggregateVersion != 1 {
			t.Errorf("row = %+v", rows[0].OutboxRecord)
		}
	})

	t.Run("ClaimMaxHeads", func(t *testing.T) {
		t.Parallel()
		db := setup(t, Options{})
		rd := relayDialect(t, db)
		a1, a2, b1, b2, c1, c2 := changed(t, "a", 1), changed(t, "a", 2), changed(t, "b", 1), changed(t, "b", 2), changed(t, "c", 1), changed(t, "c", 2)
		insert(t, db, a1, b1, c1, a2, b2, c2)
		// Two aggregates at most; the room left goes to their followers,
		// and the third aggregate stays for another worker.
		rows := claimWith(t, db, rd, driver.ClaimParams{Owner: uuid.New(), Lease: time.Minute, Limit: 6, MaxPerAggregate: 10, MaxHeads: 2})
		if !sameIDs(claimedIDs(rows), a1, b1, a2, b2) {
			t.Fatalf("claim = %v, want a1, b1, a2, b2", claimedIDs(rows))
		}
		rows = claim(t, db, rd, uuid.New(), time.Minute, 6, 10)
		if !sameIDs(claimedIDs(rows), c1, c2) {
			t.Fatalf("second claim = %v, want c1, c2", claimedIDs(rows))
		}
	})

	t.Run("FencingAndTakeover", func(t *testing.T) {
		t.Parallel()
		db := setup(t, Options{})
		rd := relayDialect(t, db)
		ctx := testsvc.Ctx(t, 30*time.Second)
		insert(t, db, changed(t, "1", 1), changed(t, "1", 2), changed(t, "2", 1))
		first, second := uuid.New(), uuid.New()
		rowsA := claim(t, db, rd, first, 100*time.Millisecond, 10, 10)
		if len(rowsA) != 3 {
			t.Fatalf("first claim got %d rows, want 3", len(rowsA))
		}
		var rowsB []driver.ClaimedRow
		testsvc.WaitFor(t, 10*time.Second, "lease expiry", func() bool {
			rowsB = claim(t, db, rd, second, time.Minute, 10, 10)
			return len(rowsB) > 0
		})
		if len(rowsB) != 3 || !rowsB[0].TakenOver {
			t.Fatalf("takeover claimed %d rows (taken over: %v), want 3", len(rowsB), len(rowsB) > 0 && rowsB[0].TakenOver)
		}
		seqs := claimedSeqs(rowsA)
		pool := db.Driver.Pool()
		if n, err := rd.MarkPublished(ctx, pool, first, seqs); err != nil || n != 0 {
			t.Fatalf("stale owner marked %d rows (err %v)", n, err)
		}
		if n, err := rd.ReleaseOutbox(ctx, pool, first, []driver.ReleaseRow{{Seq: seqs[0], Error: "x", Delay: time.Hour, Refused: true}, {Seq: seqs[1]}}); err != nil || n != 0 {
			t.Fatalf("stale owner released %d rows (err %v)", n, err)
		}
		if q, err := rd.QuarantineOutbox(ctx, pool, first, []driver.QuarantineRow{{Seq: seqs[0], Error: "x"}}); err != nil || len(q) != 0 {
			t.Fatalf("stale owner quarantined %v (err %v)", q, err)
		}
		if n, err := rd.MarkPublished(ctx, pool, second, seqs); err != nil || n != 3 {
			t.Fatalf("owner marked %d rows (err %v), want 3", n, err)
		}
		b, err := rd.OutboxBacklog(ctx, pool)
		fatalIf(t, err, "backlog")
		if b.Rows != 0 || !b.Oldest.IsZero() {
			t.Errorf("backlog after publishing = %+v, want empty", b)
		}
	})

	t.Run("ReleaseWithBackoff", func(t *testing.T) {
		t.Parallel()
		db := setup(t, Options{})
		rd := relayDialect(t, db)
		ctx := testsvc.Ctx(t, 30*time.Second)
		a1, a2, b1, c1 := changed(t, "a", 1), changed(t, "a", 2), changed(t, "b", 1), changed(t, "c", 1)
		insert(t, db, a1, a2, b1, c1)
		owner := uuid.New()
		rows := claim(t, db, rd, owner, time.Minute, 10, 10)
		if len(rows) != 4 {
			t.Fatalf("claimed %d rows, want 4", len(rows))
		}
		pool := db.Driver.Pool()
		// a1 was refused (a2 was not tried), b1 was not confirmed and waits
		// a short delay, c1 was not tried.
		n, err := rd.ReleaseOutbox(ctx, pool, owner, []driver.ReleaseRow{
			{Seq: rows[0].Seq, Error: "broker refused", Delay: time.Hour, Refused: true},
			{Seq: rows[1].Seq},
			{Seq: rows[2].Seq, Error: "timeout", Delay: 200 * time.Millisecond},
			{Seq: rows[3].Seq},
		})
		fatalIf(t, err, "release")
		if n != 4 {
			t.Fatalf("released %d rows, want 4", n)
		}
		// c1 is claimable at once; a (and a2 behind a1) waits an hour; b
		// waits its delay.
		next := claim(t, db, rd, uuid.New(), time.Minute, 10, 10)
		if !sameIDs(claimedIDs(next), c1) {
			t.Fatalf("claim after release = %v, want only c1", claimedIDs(next))
		}
		var retried []driver.ClaimedRow
		testsvc.WaitFor(t, 10*time.Second, "b1's retry delay", func() bool {
			retried = claim(t, db, rd, uuid.New(), time.Minute, 10, 10)
			return len(retried) > 0
		})
		// A refusal counts an attempt; a failure of the whole call does not.
		if !sameIDs(claimedIDs(retried), b1) || retried[0].Attempts != 0 {
			t.Fatalf("retry = %v (attempts %d), want b1 with no attempt counted", claimedIDs(retried), retried[0].Attempts)
		}
		if n := db.count(t, "outbox WHERE seq = ? AND attempts = 1 AND last_error = 'broker refused'", rows[0].Seq); n != 1 {
			t.Errorf("the refused row does not count one attempt with its error")
		}
		if n := db.count(t, "outbox WHERE seq = ? AND last_error = 'timeout'", rows[2].Seq); n != 1 {
			t.Errorf("the unconfirmed row does not keep its error")
		}
		b, err := rd.OutboxBacklog(ctx, pool)
		fatalIf(t, err, "backlog")
		if b.Rows != 4 || b.Oldest.IsZero() || time.Since(b.Oldest).Abs() > time.Hour {
			t.Errorf("backlog = %+v, want 4 rows, oldest about now", b)
		}
	})

	t.Run("DeletePublishedAndReplay", func(t *testing.T) {
		t.Parallel()
		db := setup(t, Options{})
		rd := relayDialect(t, db)
		ctx := testsvc.Ctx(t, 30*time.Second)
		var evs []idem.Event
		for i := range 5 {
			evs = append(evs, changed(t, fmt.Sprint(i), 1))
		}
		other, err := idem.NewEvent("billing.invoice.issued.v1", "invoice", "9", map[string]any{"n": 1})
		fatalIf(t, err, "event")
		evs = append(evs, other)
		insert(t, db, evs...)
		pending := changed(t, "p", 1)
		insert(t, db, pending)
		owner := uuid.New()
		rows := claim(t, db, rd, owner, time.Minute, 6, 10)
		if len(rows) != 6 {
			t.Fatalf("claimed %d rows, want 6", len(rows))
		}
		n, err := rd.MarkPublished(ctx, db.Driver.Pool(), owner, claimedSeqs(rows))
		fatalIf(t, err, "mark")
		if n != 6 {
			t.Fatalf("marked %d, want 6", n)
		}

		counts, err := rd.ReplayCounts(ctx, db.Driver.Pool(), driver.ReplayFilter{})
		fatalIf(t, err, "replay counts")
		if counts["order.order.changed.v1"] != 5 || counts["billing.invoice.issued.v1"] != 1 || len(counts) != 2 {
			t.Errorf("replay counts = %v", counts)
		}
		counts, err = rd.ReplayCounts(ctx, db.Driver.Pool(), driver.ReplayFilter{AggregateType: "invoice", Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour)})
		fatalIf(t, err, "replay counts filtered")
		if counts["billing.invoice.issued.v1"] != 1 || len(counts) != 1 {
			t.Errorf("filtered replay counts = %v", counts)
		}
		page, err := rd.ReplayRows(ctx, db.Driver.Pool(), driver.ReplayFilter{EventName: "order.order.changed.v1"}, 0, 3)
		fatalIf(t, err, "replay page")
		if len(page) != 3 {
			t.Fatalf("replay page = %d rows, want 3", len(page))
		}
		rest, err := rd.ReplayRows(ctx, db.Driver.Pool(), driver.ReplayFilter{EventName: "order.order.changed.v1"}, page[2].Seq, 10)
		fatalIf(t, err, "replay second page")
		if len(rest) != 2 || rest[0].Seq <= page[2].Seq {
			t.Fatalf("second replay page = %d rows, want 2 after seq %d", len(rest), page[2].Seq)
		}

		// Retention: nothing published before an hour ago; everything
		// published before now+1h, in batches, and never the pending row.
		if n, err := rd.DeletePublished(ctx, db.Driver.Pool(), time.Now().Add(-time.Hour), 100); err != nil || n != 0 {
			t.Fatalf("deleted %d rows published before an hour ago (err %v), want 0", n, err)
		}
		var total int64
		for {
			n, err := rd.DeletePublished(ctx, db.Driver.Pool(), time.Now().Add(time.Hour), 4)
			fatalIf(t, err, "delete published")
			if n > 4 {
				t.Fatalf("deleted %d rows in a batch of 4", n)
			}
			total += n
			if n < 4 {
				break
			}
		}
		if total != 6 {
			t.Errorf("deleted %d rows, want the 6 published", total)
		}
		if n := db.count(t, "outbox"); n != 1 {
			t.Errorf("outbox rows left = %d, want the pending one", n)
		}
	})

	t.Run("RelayPublishesInAggregateOrder", func(t *testing.T) {
		t.Parallel()
		relayOrder(t, setup)
	})
}

// relayOrder runs a relay with several workers while producers write events
// of a few aggregates concurrently, and checks that every event is published
// and each aggregate's events in version order.
func relayOrder(t *testing.T, setup Setup) {
	db := setup(t, Options{})
	pub := memory.New()
	r, err := relay.New(db.Driver, pub, relay.Config{
		Workers:         3,
		BatchSize:       20,
		MaxPerAggregate: 5,
		Lease:           5 * time.Second,
		PublishTimeout:  2 * time.Second,
		PollInterval:    20 * time.Millisecond,
		RetryBackoff:    10 * time.Millisecond,
		MaxRetryBackoff: 50 * time.Millisecond,
		StatsInterval:   -1,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	fatalIf(t, err, "new relay")
	fatalIf(t, r.Start(context.Background()), "start relay")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("stop relay: %v", err)
		}
	})
	const aggregates, versions = 4, 30
	w := outbox.NewWriter(db.Driver)
	var wg sync.WaitGroup
	errs := make(chan error, aggregates)
	for a := range aggregates {
		wg.Go(func() {
			for v := 1; v <= versions; v++ {
				ctx := context.Background()
				tx, err := db.Driver.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				if err := w.Add(ctx, tx, changed(t, fmt.Sprint("agg-", a), v)); err != nil {
					rollback(tx)
					errs <- err
					return
				}
				if err := db.Driver.Commit(ctx, tx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("producer: %v", err)
	}
	ctx := testsvc.Ctx(t, 60*time.Second)
	fatalIf(t, pub.WaitLen(ctx, aggregates*versions), "wait for every event")
	last := map[string]int64{}
	seen := map[uuid.UUID]bool{}
	for _, m := range pub.Messages() {
		ev, err := idem.Decode(m)
		fatalIf(t, err, "decode %s", m.Body)
		if seen[ev.ID] {
			continue // at least once: a copy after a lost confirm is allowed
		}
		seen[ev.ID] = true
		if ev.AggregateVersion != last[ev.AggregateID]+1 {
			t.Fatalf("aggregate %s: version %d published after %d", ev.AggregateID, ev.AggregateVersion, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.AggregateVersion
	}
	if len(seen) != aggregates*versions {
		t.Errorf("published %d distinct events, want %d", len(seen), aggregates*versions)
	}
	testsvc.WaitFor(t, 10*time.Second, "rows marked published", func() bool {
		return db.count(t, "outbox WHERE published_at IS NULL") == 0
	})
}
