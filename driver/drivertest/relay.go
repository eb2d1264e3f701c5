package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// claim claims as a relay on the driver does: through its
// driver.OutboxClaimer, or with ClaimOutbox in a transaction of its own.
func claim[TTx any](t *testing.T, db *DB[TTx], rd driver.RelayDialect, owner uuid.UUID, lease time.Duration, limit, perAggregate int) []driver.ClaimedRow {
	t.Helper()
	return claimWith(t, db, rd, driver.ClaimParams{Owner: owner, Lease: lease, Limit: limit, MaxPerAggregate: perAggregate})
}

func claimWith[TTx any](t *testing.T, db *DB[TTx], rd driver.RelayDialect, p driver.ClaimParams) []driver.ClaimedRow {
	t.Helper()
	ctx := testsvc.Ctx(t, 30*time.Second)
	if c := db.claimer(); c != nil {
		rows, err := c.ClaimOutbox(ctx, p)
		fatalIf(t, err, "claim")
		return rows
	}
	tx := db.begin(t, ctx)
	rows, err := rd.ClaimOutbox(ctx, db.Driver.Tx(tx), p)
	fatalIf(t, err, "claim")
	fatalIf(t, db.Driver.Commit(ctx, tx), "commit claim")
	return rows
}

func insert[TTx any](t *testing.T, db *DB[TTx], events ...idem.Event) {
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
func Relay[TTx any](t *testing.T, setup Setup[TTx]) {
	t.Run("ClaimHeadsOnly", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		rd := db.Driver.Dialect()
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
		db := setup.open(t, Options{})
		rd := db.Driver.Dialect()
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
		db := setup.open(t, Options{})
		rd := db.Driver.Dialect()
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
		db := setup.open(t, Options{})
		rd := db.Driver.Dialect()
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
		db := setup.open(t, Options{})
		rd := db.Driver.Dialect()
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
			{Seq: rows[2].Seq, Error: "timeout", Delay: 2 * time.Second}, // long enough for a loaded machine's next claim
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
		db := setup.open(t, Options{})
		rd := db.Driver.Dialect()
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

	t.Run("ClaimUnreadableRows", func(t *testing.T) {
		t.Parallel()
		claimUnreadable(t, setup)
	})
	t.Run("QuarantineHoldsItsAggregate", func(t *testing.T) {
		t.Parallel()
		quarantineHolds(t, setup)
	})
	t.Run("QuarantineOperations", func(t *testing.T) {
		t.Parallel()
		quarantineOperations(t, setup)
	})
	t.Run("RelayQuarantinesUnreadableRows", func(t *testing.T) {
		t.Parallel()
		relayUnreadable(t, setup)
	})
	t.Run("RelayPublishesTextIDs", func(t *testing.T) {
		t.Parallel()
		relayTextIDs(t, setup)
	})
	t.Run("RelayQuarantinesRefusedRow", func(t *testing.T) {
		t.Parallel()
		relayRefused(t, setup)
	})
	t.Run("RelayBrokerAwayQuarantinesNothing", func(t *testing.T) {
		t.Parallel()
		relayBrokerAway(t, setup)
	})
	t.Run("RelayBinaryPayload", func(t *testing.T) {
		t.Parallel()
		relayBinaryPayload(t, setup)
	})
	t.Run("WakeUps", func(t *testing.T) {
		t.Parallel()
		wakeUps(t, setup)
	})
	t.Run("WakeUpsWhileWaiting", func(t *testing.T) {
		t.Parallel()
		wakeUpsWhileWaiting(t, setup)
	})
}

// wakeUpsWhileWaiting checks a driver.OutboxWaitListener: inserts do not
// notify until the relay reports that it is idle; then the listener waits
// for the transactions that inserted without notifying to end, notifies
// once so that the relay claims their rows, and inserts notify until a
// notification arrives.
func wakeUpsWhileWaiting[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	l, ok := any(db.Driver).(driver.OutboxWaitListener)
	if !ok {
		t.Skipf("%T is no driver.OutboxWaitListener: its relays poll, or are notified on every insert (WakeUps)", db.Driver)
	}
	ctx, cancel := context.WithCancel(testsvc.Ctx(t, time.Minute))
	defer cancel()
	notes := make(chan struct{}, 100)
	idle := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- l.ListenOutboxWaiting(ctx, func() { notes <- struct{}{} }, idle) }()
	waitNote := func(what string) {
		t.Helper()
		select {
		case <-notes:
		case err := <-done:
			t.Fatalf("ListenOutboxWaiting ended (%v) before %s", err, what)
		case <-time.After(10 * time.Second):
			t.Fatalf("no notification %s", what)
		}
	}
	waitNote("once listening")
	insert(t, db, changed(t, "busy", 1))

	// A transaction that inserted while the relay was busy holds the
	// relay's wait back until it ends; then one notification says: claim.
	tx := db.begin(t, ctx)
	if db.Session == nil || db.Blocking == nil {
		t.Fatal("drivertest: DB.Session and DB.Blocking are required to check a driver.OutboxWaitListener")
	}
	session, err := db.Session(ctx, db.Driver.Tx(tx))
	fatalIf(t, err, "the open transaction's session")
	w := outbox.NewWriter(db.Driver)
	fatalIf(t, w.Add(ctx, tx, changed(t, "open", 1)), "insert in an open transaction")
	idle <- struct{}{}
	// Once the listener waits for the transaction, the inserts while the
	// relay was busy are behind it, and nothing may notify until the
	// transaction ends.
	testsvc.WaitFor(t, 10*time.Second, "the listener waiting for the transaction that inserted while the relay was busy", func() bool {
		blocked, err := db.Blocking(ctx, session)
		fatalIf(t, err, "DB.Blocking")
		select { // after Blocking: a notification sent before the wait began is here
		case <-notes:
			t.Fatal("notified before the transaction that inserted while the relay was busy ended (for an insert while it was busy, or without waiting for that transaction)")
		case err := <-done:
			t.Fatalf("ListenOutboxWaiting ended (%v) while the relay reported it was idle", err)
		default:
		}
		return blocked
	})
	fatalIf(t, db.Driver.Commit(ctx, tx), "commit")
	waitNote("once the relay waits, for the rows committed before")

	insert(t, db, changed(t, "waiting", 1))
	waitNote("after an insert while the relay waited")
	cancel()
	if err := <-done; err == nil {
		t.Error("ListenOutboxWaiting returned nil when its context ended, want why it stopped")
	}
	// Every notification the listener sent is here now.
	if n := len(notes); n != 0 {
		t.Errorf("%d notifications more than the three expected (once listening, once the relay waits, after an insert while it waits)", n)
	}
}

// wakeUps checks how a relay on the driver learns of new rows. A
// driver.OutboxListener calls notify once it listens, then after a
// committed insert, until its context ends; a relay that would poll once an
// hour publishes each row as it is inserted. A relay on a driver without
// one polls every PollIntervalNoListenDefault and publishes each row
// within a few polls.
func wakeUps[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	pub := memory.New()
	cfg := quarantineConfig()
	cfg.Workers = 1
	l, listens := any(db.Driver).(driver.OutboxListener)
	if listens {
		ctx, cancel := context.WithCancel(testsvc.Ctx(t, time.Minute))
		notes := make(chan struct{}, 100)
		done := make(chan error, 1)
		go func() { done <- l.ListenOutbox(ctx, func() { notes <- struct{}{} }) }()
		waitNote := func(what string) {
			t.Helper()
			select {
			case <-notes:
			case err := <-done:
				t.Fatalf("ListenOutbox ended (%v) before %s", err, what)
			case <-time.After(10 * time.Second):
				t.Fatalf("no notification %s", what)
			}
		}
		waitNote("once listening")
		insert(t, db, changed(t, "l", 1))
		waitNote("after an insert")
		cancel()
		if err := <-done; err == nil {
			t.Error("ListenOutbox returned nil when its context ended, want why it stopped")
		}
		cfg.PollInterval = time.Hour // after its first claim, only a notification wakes the relay
	} else {
		r, err := relay.New(db.Driver, pub, relay.Config{Logger: testlog.New(t)})
		fatalIf(t, err, "new relay")
		if got := r.Config().PollInterval; got != relay.PollIntervalNoListenDefault {
			t.Errorf("PollInterval of a relay without a listener = %v, want %v", got, relay.PollIntervalNoListenDefault)
		}
		cfg.PollInterval = 0 // the default
	}
	startRelay(t, db, pub, cfg)
	ctx := testsvc.Ctx(t, time.Minute)
	fatalIf(t, waitDistinct(ctx, pub, db.count(t, "outbox")), "the rows there at the start published")
	for i := range 3 {
		ev := changed(t, fmt.Sprint("w", i), 1)
		insert(t, db, ev)
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := waitPublished(wctx, pub, ev.ID)
		cancel()
		fatalIf(t, err, "row %d published as it was inserted", i)
	}
}

// relayOrder runs a relay with several workers while producers write events
// of a few aggregates concurrently, and checks that every event is published
// and each aggregate's events in version order.
func relayOrder[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	pub := memory.New()
	cfg := quarantineConfig()
	cfg.Workers, cfg.BatchSize, cfg.MaxPerAggregate, cfg.StatsInterval = 3, 20, 5, -1
	startRelay(t, db, pub, cfg)
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
					db.rollback(ctx, tx)
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
	fatalIf(t, waitDistinct(ctx, pub, aggregates*versions), "wait for every event")
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

// foreignRow inserts, with plain SQL as another program would, a row of
// aggregate order/aggregate that an idem relay cannot publish: its id is
// not a UUID and is over 64 bytes (though 64 characters at most, which a
// VARCHAR(64) takes), so that idem.EventID refuses it (where
// Features.UUIDColumns refuse such ids, its headers are not a JSON object).
// It returns the row's seq.
func foreignRow[TTx any](t *testing.T, db *DB[TTx], aggregate string) int64 {
	t.Helper()
	id, headers := foreignID(aggregate), "{}"
	if db.Features.UUIDColumns {
		id, headers = uuid.NewString(), `"not an object"`
	}
	db.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers)
VALUES (?, 'order', ?, 'OrderCreated', '{"orderId": 42}', ?)`, id, aggregate, headers)
	return seqOf(t, db, aggregate)
}

// foreignID is the id foreignRow writes: "E-<aggregate>" then "é" up to 64
// characters, over 64 bytes.
func foreignID(aggregate string) string {
	id := "E-" + aggregate
	return id + strings.Repeat("\u00e9", 64-utf8.RuneCountInString(id))
}

// seqOf returns the seq of the last outbox row of order/aggregate.
func seqOf[TTx any](t *testing.T, db *DB[TTx], aggregate string) int64 {
	t.Helper()
	var seq int64
	db.queryRow(t, `SELECT seq FROM outbox WHERE aggregateid = ? ORDER BY seq DESC LIMIT 1`, []any{aggregate}, &seq)
	return seq
}

// repair makes a row written by foreignRow publishable, as an operator
// would with SQL, and returns its event id.
func repair[TTx any](t *testing.T, db *DB[TTx], seq int64) uuid.UUID {
	t.Helper()
	if db.Features.UUIDColumns {
		db.exec(t, `UPDATE outbox SET headers = '{}' WHERE seq = ?`, seq)
		var id string
		db.queryRow(t, `SELECT id FROM outbox WHERE seq = ?`, []any{seq}, &id)
		return uuid.MustParse(id)
	}
	id := idem.NewEventID()
	db.exec(t, `UPDATE outbox SET id = ? WHERE seq = ?`, id.String(), seq)
	return id
}

func findSeq(rows []driver.ClaimedRow, seq int64) *driver.ClaimedRow {
	for i := range rows {
		if rows[i].Seq == seq {
			return &rows[i]
		}
	}
	return nil
}

// claimUnreadable: a claim never fails on a row's content. A row that cannot
// become a message comes back marked Unreadable, with the reason; the other
// rows come back as usual, and rows are marked published by seq.
func claimUnreadable[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	rd := db.Driver.Dialect()
	ctx := testsvc.Ctx(t, 30*time.Second)
	a1, b1 := changed(t, "a", 1), changed(t, "b", 1)
	insert(t, db, a1)
	foreign := foreignRow(t, db, "f")
	insert(t, db, b1)
	var loose int64
	if db.Features.DynamicTyping {
		// Columns that take any type: a timestamp and a version that are
		// not, and headers that are not JSON.
		db.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers)
VALUES (?, 'order', 'g', 'OrderCreated', '{}', 'yesterday', 'v1', 'not json')`, uuid.NewString())
		loose = seqOf(t, db, "g")
	}
	// Headers that are JSON but not an object.
	db.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers) VALUES (?, 'order', 'h', 'OrderCreated', '{}', ?)`,
		uuid.NewString(), `["not", "an", "object"]`)
	notObject := seqOf(t, db, "h")
	// Another spelling of a UUID: readable, and marked by seq.
	db.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', 'u', 'OrderCreated', '{}')`,
		strings.ToUpper(uuid.NewString()))
	upper := seqOf(t, db, "u")

	owner := uuid.New()
	rows := claim(t, db, rd, owner, time.Minute, 10, 10)
	want := 5
	if loose != 0 {
		want++
	}
	if len(rows) != want {
		t.Fatalf("claimed %d rows, want %d (readable or not)", len(rows), want)
	}
	f := findSeq(rows, foreign)
	if f == nil || f.Unreadable == nil {
		t.Fatalf("foreign row %d not returned as unreadable: %+v", foreign, f)
	}
	var ue *driver.UnreadableError
	if !errors.As(f.Unreadable, &ue) || ue.Seq != foreign {
		t.Errorf("Unreadable = %#v, want a *driver.UnreadableError for seq %d", f.Unreadable, foreign)
	}
	if db.Features.UUIDColumns {
		if !strings.Contains(f.Unreadable.Error(), "headers") || string(f.RawHeaders) != `"not an object"` {
			t.Errorf("unreadable headers: %v (raw %q)", f.Unreadable, f.RawHeaders)
		}
	} else if f.RawID != foreignID("f") || f.ID != uuid.Nil || !strings.Contains(f.Unreadable.Error(), "is 125 bytes long, more than 64") {
		t.Errorf("foreign row: raw id %q, id %v, unreadable %v", f.RawID, f.ID, f.Unreadable)
	}
	if f.Type != "OrderCreated" || f.AggregateID != "f" || string(f.Payload) == "" {
		t.Errorf("foreign row content lost: %+v", f.OutboxRecord)
	}
	if loose != 0 {
		g := findSeq(rows, loose)
		if g == nil || g.Unreadable == nil {
			t.Fatalf("row with a text timestamp and version not returned as unreadable: %+v", g)
		}
		for _, want := range []string{"occurred_at", `"yesterday"`, "aggregate_version", `"v1"`, "headers", `"not json"`} {
			if !strings.Contains(g.Unreadable.Error(), want) {
				t.Errorf("unreadable reason %q does not name %s", g.Unreadable, want)
			}
		}
	}
	var readable []int64
	for _, r := range rows {
		if r.Unreadable == nil {
			readable = append(readable, r.Seq)
			if r.ID == uuid.Nil || r.RawID == "" {
				t.Errorf("readable row %d: id %v, raw %q", r.Seq, r.ID, r.RawID)
			}
		}
	}
	if u := findSeq(rows, upper); u == nil || u.Unreadable != nil || u.ID == uuid.Nil {
		t.Errorf("row with an upper-case UUID: %+v", u)
	}
	if h := findSeq(rows, notObject); h == nil || h.Unreadable == nil || !strings.Contains(h.Unreadable.Error(), "headers") {
		t.Errorf("row whose headers are not an object: %+v, want unreadable", h)
	}
	n, err := rd.MarkPublished(ctx, db.Driver.Pool(), owner, readable)
	fatalIf(t, err, "mark")
	if n != int64(len(readable)) {
		t.Errorf("marked %d of the %d readable rows", n, len(readable))
	}
}

// quarantineHolds: a quarantined row is never claimed, and holds the later
// rows of its aggregate behind it, as a head or after an unpublished head;
// other aggregates are claimed.
func quarantineHolds[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	rd := db.Driver.Dialect()
	ctx := testsvc.Ctx(t, 30*time.Second)
	pool := db.Driver.Pool()
	a1, a2, a3 := changed(t, "a", 1), changed(t, "a", 2), changed(t, "a", 3)
	b1 := changed(t, "b", 1)
	d1, d2, d3 := changed(t, "d", 1), changed(t, "d", 2), changed(t, "d", 3)
	insert(t, db, a1, a2, a3, b1, d1, d2, d3)
	owner := uuid.New()
	rows := claim(t, db, rd, owner, time.Minute, 20, 10)
	if len(rows) != 7 {
		t.Fatalf("claimed %d rows, want 7", len(rows))
	}
	seq := map[uuid.UUID]int64{}
	for _, r := range rows {
		seq[r.ID] = r.Seq
	}
	// a1 is quarantined as a head; d2 after d1, which stays unpublished (its
	// mark was lost).
	got, err := rd.QuarantineOutbox(ctx, pool, owner, []driver.QuarantineRow{
		{Seq: seq[d2.ID], Error: "refused: d2"}, {Seq: seq[a1.ID], Error: "refused: a1"}})
	fatalIf(t, err, "quarantine")
	if len(got) != 2 || got[0] != seq[a1.ID] || got[1] != seq[d2.ID] {
		t.Fatalf("QuarantineOutbox = %v, want [%d %d]", got, seq[a1.ID], seq[d2.ID])
	}
	var rest []driver.ReleaseRow
	for _, ev := range []idem.Event{a2, a3, b1, d1, d3} {
		rest = append(rest, driver.ReleaseRow{Seq: seq[ev.ID]})
	}
	n, err := rd.ReleaseOutbox(ctx, pool, owner, rest)
	fatalIf(t, err, "release")
	if n != 5 {
		t.Fatalf("released %d rows, want 5", n)
	}
	if n := db.count(t, "outbox WHERE quarantined_at IS NOT NULL AND attempts = 1 AND lease_owner IS NULL AND lease_until IS NULL AND last_error LIKE 'refused: %'"); n != 2 {
		t.Fatalf("%d rows quarantined with one attempt, their error and no lease, want 2", n)
	}

	next := claim(t, db, rd, uuid.New(), time.Minute, 20, 10)
	if !sameIDs(claimedIDs(next), b1, d1) {
		t.Fatalf("claim with a1 and d2 quarantined = %v, want b1 and d1 only", claimedIDs(next))
	}
	// With heads alone, too.
	if again := claimWith(t, db, rd, driver.ClaimParams{Owner: uuid.New(), Lease: time.Minute, Limit: 20, MaxPerAggregate: 1}); len(again) != 0 {
		t.Fatalf("claimed %v while every head is leased or quarantined", claimedIDs(again))
	}
	b, err := rd.OutboxBacklog(ctx, pool)
	fatalIf(t, err, "backlog")
	if b.Rows != 5 || b.Quarantined != 2 {
		t.Errorf("backlog = %+v, want 5 rows (a2, a3, b1, d1, d3) and 2 quarantined", b)
	}
}

// quarantineOperations: list with filters and pages, get, requeue and
// delete, each only on quarantined rows.
func quarantineOperations[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	rd := db.Driver.Dialect()
	ctx := testsvc.Ctx(t, 30*time.Second)
	pool := db.Driver.Pool()
	a1, a2, b1, c1, c2, c3 := changed(t, "a", 1), changed(t, "a", 2), changed(t, "b", 1), changed(t, "c", 1), changed(t, "c", 2), changed(t, "c", 3)
	c1.Headers = map[string]string{"trace": "t-1"}
	insert(t, db, a1, a2, b1, c1, c2, c3)
	foreign := foreignRow(t, db, "f")
	owner := uuid.New()
	rows := claim(t, db, rd, owner, time.Minute, 1, 1) // a1 alone
	rows = append(rows, claim(t, db, rd, owner, time.Minute, 20, 1)...)
	seq := map[uuid.UUID]int64{}
	for _, r := range rows {
		seq[r.ID] = r.Seq
	}
	before := time.Now().Add(-time.Minute)
	q, err := rd.QuarantineOutbox(ctx, pool, owner, []driver.QuarantineRow{
		{Seq: seq[a1.ID], Error: "unroutable"}, {Seq: seq[c1.ID], Error: "too large"}, {Seq: foreign, Error: "unreadable"}})
	fatalIf(t, err, "quarantine")
	if len(q) != 3 {
		t.Fatalf("quarantined %v, want 3 rows", q)
	}
	_, err = rd.ReleaseOutbox(ctx, pool, owner, []driver.ReleaseRow{{Seq: seq[b1.ID]}})
	fatalIf(t, err, "release")

	list, err := rd.ListQuarantined(ctx, pool, driver.QuarantineFilter{})
	fatalIf(t, err, "list")
	if len(list) != 3 || list[0].Seq != seq[a1.ID] || list[1].Seq != seq[c1.ID] || list[2].Seq != foreign {
		t.Fatalf("list = %v, want a1, c1 and the foreign row in seq order", quarantinedSeqs(list))
	}
	c := list[1]
	if c.ID != c1.ID || c.RawID != c1.ID.String() || c.LastError != "too large" || c.Attempts != 1 || c.Type != c1.Name ||
		c.AggregateID != "c" || !jsonEqual(c.Payload, c1.Payload) || c.Headers["trace"] != "t-1" || c.Unreadable != nil ||
		c.QuarantinedAt.Before(before) || c.QuarantinedAt.After(time.Now().Add(time.Minute)) || c.OccurredAt.IsZero() {
		t.Errorf("listed row = %+v", c)
	}
	if f := list[2]; f.Unreadable == nil || f.LastError != "unreadable" {
		t.Errorf("listed foreign row: unreadable %v, error %q", f.Unreadable, f.LastError)
	}
	for _, tc := range []struct {
		name string
		f    driver.QuarantineFilter
		want []int64
	}{
		{"aggregate", driver.QuarantineFilter{AggregateType: "order", AggregateID: "c"}, []int64{seq[c1.ID]}},
		{"event", driver.QuarantineFilter{EventName: "OrderCreated"}, []int64{foreign}},
		{"first page", driver.QuarantineFilter{Limit: 2}, []int64{seq[a1.ID], seq[c1.ID]}},
		{"second page", driver.QuarantineFilter{Limit: 2, AfterSeq: seq[c1.ID]}, []int64{foreign}},
		{"since", driver.QuarantineFilter{Since: before}, []int64{seq[a1.ID], seq[c1.ID], foreign}},
		{"since later", driver.QuarantineFilter{Since: time.Now().Add(time.Hour)}, nil},
		{"other type", driver.QuarantineFilter{AggregateType: "invoice"}, nil},
	} {
		got, err := rd.ListQuarantined(ctx, pool, tc.f)
		fatalIf(t, err, "list %s", tc.name)
		if !slices.Equal(quarantinedSeqs(got), tc.want) {
			t.Errorf("list %s = %v, want %v", tc.name, quarantinedSeqs(got), tc.want)
		}
	}

	g, err := rd.GetQuarantined(ctx, pool, seq[c1.ID])
	fatalIf(t, err, "get")
	if g.Seq != c.Seq || g.LastError != c.LastError || !bytes.Equal(g.RawHeaders, c.RawHeaders) {
		t.Errorf("get = %+v, want %+v", g, c)
	}
	for _, s := range []int64{seq[b1.ID], seq[c2.ID], 1 << 40} {
		if _, err := rd.GetQuarantined(ctx, pool, s); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("get %d (not quarantined) = %v, want ErrNotFound", s, err)
		}
	}

	// Requeue a1 (b1, not quarantined, is left alone): the relay's next
	// claim takes a1, with no attempt counted, then a2 behind it.
	n, err := rd.RequeueQuarantined(ctx, pool, []int64{seq[a1.ID], seq[b1.ID]})
	fatalIf(t, err, "requeue")
	if n != 1 {
		t.Fatalf("requeued %d rows, want 1", n)
	}
	next := claim(t, db, rd, uuid.New(), time.Minute, 20, 10)
	if !sameIDs(claimedIDs(next), a1, a2, b1) {
		t.Fatalf("claim after the requeue = %v, want a1, a2, b1", claimedIDs(next))
	}
	if next[0].Attempts != 0 {
		t.Errorf("requeued row has %d attempts, want 0", next[0].Attempts)
	}
	if n := db.count(t, "outbox WHERE seq = ? AND last_error = 'unroutable'", seq[a1.ID]); n != 1 {
		t.Errorf("requeue dropped the row's last error")
	}

	// Delete c1 and the foreign row (b1, leased, is left alone): c2 and c3
	// are claimable.
	n, err = rd.DeleteQuarantined(ctx, pool, []int64{seq[c1.ID], foreign, seq[b1.ID]})
	fatalIf(t, err, "delete")
	if n != 2 {
		t.Fatalf("deleted %d rows, want 2", n)
	}
	next = claim(t, db, rd, uuid.New(), time.Minute, 20, 10)
	if !sameIDs(claimedIDs(next), c2, c3) {
		t.Fatalf("claim after the delete = %v, want c2, c3", claimedIDs(next))
	}
	if n := db.count(t, "outbox"); n != 5 {
		t.Errorf("%d rows left, want 5", n)
	}
	if list, err := rd.ListQuarantined(ctx, pool, driver.QuarantineFilter{}); err != nil || len(list) != 0 {
		t.Errorf("list at the end = %v, %v; want none", quarantinedSeqs(list), err)
	}
}

func quarantinedSeqs(rows []driver.QuarantinedRow) []int64 {
	var out []int64
	for _, r := range rows {
		out = append(out, r.Seq)
	}
	return out
}

// quarantineConfig is a relay configuration with short delays for the
// quarantine checks.
func quarantineConfig() relay.Config {
	return relay.Config{
		Workers:         2,
		BatchSize:       200,
		Lease:           5 * time.Second,
		PublishTimeout:  2 * time.Second,
		PollInterval:    20 * time.Millisecond,
		RetryBackoff:    10 * time.Millisecond,
		MaxRetryBackoff: 50 * time.Millisecond,
		StatsInterval:   20 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func startRelay[TTx any](t *testing.T, db *DB[TTx], pub *memory.Publisher, cfg relay.Config) *relay.Relay[TTx] {
	t.Helper()
	r, err := relay.New(db.Driver, pub, cfg)
	fatalIf(t, err, "new relay")
	fatalIf(t, r.Start(context.Background()), "start relay")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("stop relay: %v", err)
		}
	})
	return r
}

// byAggregate returns the event ids published for aggregate, in order of
// first publication.
func byAggregate(msgs []idem.Message, aggregate string) []uuid.UUID {
	var out []uuid.UUID
	seen := map[uuid.UUID]bool{}
	for _, m := range msgs {
		if string(m.Key) == aggregate && !seen[m.EventID] {
			seen[m.EventID] = true
			out = append(out, m.EventID)
		}
	}
	return out
}

// relayUnreadable: rows written by another program that cannot become
// messages, among rows of 1,000 other aggregates. Every other row is
// published; each unreadable row is quarantined at its first claim; the
// later row of its aggregate waits until the row is removed, or repaired
// and re-driven, then goes, in order.
func relayUnreadable[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	rd := db.Driver.Dialect()
	ctx := testsvc.Ctx(t, 2*time.Minute)
	pool := db.Driver.Pool()
	const aggregates = 1000
	var good []idem.Event
	for a := range aggregates {
		good = append(good, changed(t, fmt.Sprint(a), 1))
	}
	insert(t, db, good[:aggregates/2]...)
	f1 := foreignRow(t, db, "foreign-1")
	f2 := foreignRow(t, db, "foreign-2")
	after1, after2 := changed(t, "foreign-1", 2), changed(t, "foreign-2", 2)
	insert(t, db, after1, after2)
	insert(t, db, good[aggregates/2:]...)

	pub := memory.New()
	cfg := quarantineConfig()
	cfg.QuarantineAfter = 100 // only unreadable rows can be quarantined here
	r := startRelay(t, db, pub, cfg)
	fatalIf(t, waitDistinct(ctx, pub, aggregates), "every other row published")
	testsvc.WaitFor(t, 30*time.Second, "both foreign rows quarantined", func() bool {
		return db.count(t, "outbox WHERE quarantined_at IS NOT NULL") == 2 && r.Stats().Quarantined == 2
	})
	if n := db.count(t, "outbox WHERE quarantined_at IS NOT NULL AND attempts = 1 AND last_error LIKE '%cannot be published%'"); n != 2 {
		t.Errorf("%d foreign rows quarantined at their first claim with the reason, want 2", n)
	}
	testsvc.WaitFor(t, 30*time.Second, "every other row marked", func() bool {
		return db.count(t, "outbox WHERE published_at IS NULL") == 4
	})
	testsvc.WaitFor(t, 10*time.Second, "quarantined rows measured", func() bool {
		s := r.Stats()
		return s.QuarantinedRows == 2 && s.Backlog == 2
	})
	for _, agg := range []string{"foreign-1", "foreign-2"} {
		if got := byAggregate(pub.Messages(), agg); len(got) != 0 {
			t.Fatalf("published %v of aggregate %s, held by its quarantined row", got, agg)
		}
	}
	if n := distinct(pub.Messages()); n != aggregates {
		t.Errorf("published %d distinct events, want %d", n, aggregates)
	}

	// Removing f2 lets the row behind it go.
	n, err := rd.DeleteQuarantined(ctx, pool, []int64{f2})
	fatalIf(t, err, "delete")
	if n != 1 {
		t.Fatalf("deleted %d rows, want 1", n)
	}
	fatalIf(t, waitPublished(ctx, pub, after2.ID), "the row behind the removed one published")
	if got := byAggregate(pub.Messages(), "foreign-2"); !slices.Equal(got, []uuid.UUID{after2.ID}) {
		t.Fatalf("aggregate foreign-2 published %v, want %v", got, after2.ID)
	}

	// Re-driving f1 as it is cannot help: it is quarantined again at once.
	_, err = rd.RequeueQuarantined(ctx, pool, []int64{f1})
	fatalIf(t, err, "requeue")
	testsvc.WaitFor(t, 30*time.Second, "f1 quarantined again", func() bool { return r.Stats().Quarantined == 3 })
	if n := db.count(t, "outbox WHERE seq = ? AND quarantined_at IS NOT NULL AND attempts = 1", f1); n != 1 {
		t.Fatalf("f1 not quarantined again after one attempt")
	}
	// Repaired, then re-driven: f1 goes, then the row behind it.
	id := repair(t, db, f1)
	_, err = rd.RequeueQuarantined(ctx, pool, []int64{f1})
	fatalIf(t, err, "requeue")
	fatalIf(t, waitPublished(ctx, pub, id, after1.ID), "f1 and the row behind it published")
	if got := byAggregate(pub.Messages(), "foreign-1"); !slices.Equal(got, []uuid.UUID{id, after1.ID}) {
		t.Fatalf("aggregate foreign-1 published %v, want %v then %v", got, id, after1.ID)
	}
	testsvc.WaitFor(t, 30*time.Second, "everything marked", func() bool {
		return db.count(t, "outbox WHERE published_at IS NULL") == 0
	})
}

// relayTextIDs: rows written by another program with ids that are not
// UUIDs (the Debezium article's table has id VARCHAR(64), its events are
// called E42) are published under the UUID idem.EventID derives, with the
// id in the header idem.HeaderOriginalID, and a consumer applies each once;
// an id of 65 bytes is quarantined, saying why; a row an idem before this
// rule quarantined for its id ("is not a UUID") is published once
// re-driven. With Features.UUIDColumns, on an outbox whose id column
// DB.TextIDs made text.
func relayTextIDs[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	if db.Features.UUIDColumns {
		db.exec(t, db.TextIDs)
	}
	db.exec(t, reservationTable)
	rd := db.Driver.Dialect()
	ctx := testsvc.Ctx(t, time.Minute)
	pool := db.Driver.Pool()
	row := func(id, aggregate string) int64 {
		t.Helper()
		db.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', ?, 'order.order.placed.v1', '{"total": 1}')`,
			id, aggregate)
		return seqOf(t, db, aggregate)
	}
	// Quarantined by an idem before the rule: claimed, then set aside with
	// the error it gave.
	old := "E-old"
	oldSeq := row(old, "old")
	owner := uuid.New()
	if got := claim(t, db, rd, owner, time.Minute, 10, 10); len(got) != 1 {
		t.Fatalf("claimed %d rows, want the old one", len(got))
	}
	_, err := rd.QuarantineOutbox(ctx, pool, owner, []driver.QuarantineRow{{Seq: oldSeq,
		Error: fmt.Sprintf(`idem: outbox row seq %d cannot be published: id "E-old" is not a UUID`, oldSeq)}})
	fatalIf(t, err, "quarantine the old row")

	ids := map[string]string{ // aggregate: id
		"e42":  "E42",
		"long": "E" + strings.Repeat("-", 62) + "2", // 64 bytes
		"utf8": strings.Repeat("\u00e9", 32),        // 64 bytes, 32 characters
	}
	for agg, id := range ids {
		row(id, agg)
	}
	tooLong := "x" + strings.Repeat("\u00e9", 32) // 65 bytes, 33 characters
	tooLongSeq := row(tooLong, "too-long")

	want := map[uuid.UUID]string{} // event id: original id
	for _, id := range ids {
		u, err := idem.EventID(id)
		fatalIf(t, err, "EventID(%q)", id)
		want[u] = id
	}
	pub := memory.New()
	r := startRelay(t, db, pub, quarantineConfig())
	fatalIf(t, waitPublished(ctx, pub, slices.Collect(maps.Keys(want))...), "the rows with text ids published")
	testsvc.WaitFor(t, 30*time.Second, "the 65-byte id quarantined", func() bool {
		return db.count(t, "outbox WHERE seq = ? AND quarantined_at IS NOT NULL", tooLongSeq) == 1
	})
	q, err := rd.GetQuarantined(ctx, pool, tooLongSeq)
	fatalIf(t, err, "get the quarantined row")
	if q.RawID != tooLong || q.ID != uuid.Nil || q.Attempts != 1 ||
		!strings.Contains(q.LastError, `is 65 bytes long, more than 64: an event id is a UUID, or 1 to 64 bytes`) {
		t.Errorf("quarantined 65-byte id: raw %q, id %v, attempts %d, error %q", q.RawID, q.ID, q.Attempts, q.LastError)
	}

	// The old row, re-driven, goes under its derived id.
	oldID, err := idem.EventID(old)
	fatalIf(t, err, "EventID(%q)", old)
	want[oldID] = old
	n, err := rd.RequeueQuarantined(ctx, pool, []int64{oldSeq})
	fatalIf(t, err, "requeue the old row")
	if n != 1 {
		t.Fatalf("requeued %d rows, want 1", n)
	}
	fatalIf(t, waitPublished(ctx, pub, oldID), "the old row published once re-driven")
	testsvc.WaitFor(t, 30*time.Second, "every readable row marked", func() bool {
		return db.count(t, "outbox WHERE published_at IS NULL") == 1
	})
	if s := r.Stats(); s.Quarantined != 1 {
		t.Errorf("relay quarantined %d rows, want 1 (the 65-byte id)", s.Quarantined)
	}

	// One copy of each event, checked; then each delivered twice.
	first := map[uuid.UUID]idem.Message{}
	for _, m := range pub.Messages() {
		if _, ok := first[m.EventID]; !ok {
			first[m.EventID] = m
		}
	}
	if len(first) != len(want) {
		t.Fatalf("published %d distinct events, want %d", len(first), len(want))
	}
	var ds []inbox.Delivery
	for id, raw := range want {
		m := first[id]
		if m.Headers[idem.HeaderOriginalID] != raw {
			t.Errorf("event %s: header %s = %q, want %q", id, idem.HeaderOriginalID, m.Headers[idem.HeaderOriginalID], raw)
		}
		ev, err := idem.Decode(m)
		fatalIf(t, err, "decode %s", m.Body)
		if ev.ID != id || ev.Headers[idem.HeaderOriginalID] != raw || ev.Name != "order.order.placed.v1" {
			t.Errorf("event %s decoded as %+v", id, ev)
		}
		ds = append(ds, inbox.Delivery{Message: m, Source: "stock.events", Attempt: 1})
	}
	c := consumer(t, db, "stock", nil)
	for i, wantOutcome := range []inbox.Outcome{inbox.Applied, inbox.Duplicate} {
		for j, d := range deliver(t, c, ds...) {
			if d.Outcome != wantOutcome {
				t.Errorf("delivery %d of event %s: %v, want %v", i+1, ds[j].Message.EventID, d.Outcome, wantOutcome)
			}
		}
	}
	for id := range want {
		if n := db.count(t, "processed_event WHERE consumer_name = 'stock' AND event_id = ?", id.String()); n != 1 {
			t.Errorf("event %s: %d markers, want 1", id, n)
		}
		if n := db.count(t, "reservation WHERE product_id = ?", "p-"+id.String()); n != 1 {
			t.Errorf("event %s applied %d times, want once", id, n)
		}
	}
}

// relayRefused: a row the broker refuses (unroutable) is quarantined after
// exactly QuarantineAfter attempts while the other aggregates flow; the row
// behind it waits; re-driven once the broker takes it, it is published, then
// the row behind it, in order.
func relayRefused[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	rd := db.Driver.Dialect()
	ctx := testsvc.Ctx(t, 2*time.Minute)
	bad1, bad2 := changed(t, "bad", 1), changed(t, "bad", 2)
	var good []idem.Event
	for a := range 50 {
		for v := 1; v <= 3; v++ {
			good = append(good, changed(t, fmt.Sprint(a), v))
		}
	}
	insert(t, db, bad1, bad2)
	insert(t, db, good...)
	pub := memory.New()
	var refusals atomic.Int64
	pub.SetFunc(func(int, []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			if m.EventID == bad1.ID {
				refusals.Add(1)
				return fmt.Errorf("exchange events, routing key %s: %w", m.EventName, broker.ErrUnroutable)
			}
			return nil
		}}
	})
	cfg := quarantineConfig()
	cfg.QuarantineAfter = 3
	r := startRelay(t, db, pub, cfg)
	fatalIf(t, waitDistinct(ctx, pub, len(good)), "the other aggregates published")
	testsvc.WaitFor(t, 30*time.Second, "bad1 quarantined", func() bool {
		return db.count(t, "outbox WHERE quarantined_at IS NOT NULL") == 1 && r.Stats().Quarantined == 1
	})
	list, err := rd.ListQuarantined(ctx, db.Driver.Pool(), driver.QuarantineFilter{})
	fatalIf(t, err, "list")
	if len(list) != 1 || list[0].ID != bad1.ID || list[0].Attempts != 3 ||
		!strings.Contains(list[0].LastError, "refused by the broker on 3 attempts") || !strings.Contains(list[0].LastError, "unroutable") {
		t.Fatalf("quarantined = %+v, want bad1 after 3 attempts with its error", list)
	}
	seq := list[0].Seq
	if got := refusals.Load(); got != 3 {
		t.Errorf("bad1 offered to the broker %d times, want 3", got)
	}
	if got := byAggregate(pub.Messages(), "bad"); len(got) != 0 {
		t.Fatalf("published %v of the quarantined aggregate", got)
	}
	if n := db.count(t, "outbox WHERE aggregateid = 'bad' AND published_at IS NULL"); n != 2 {
		t.Fatalf("%d unpublished rows of the quarantined aggregate, want 2", n)
	}
	checkFirstOrder(t, pub.Messages())

	// The binding exists now; re-drive.
	pub.SetFunc(nil)
	n, err := rd.RequeueQuarantined(ctx, db.Driver.Pool(), []int64{seq})
	fatalIf(t, err, "requeue")
	if n != 1 {
		t.Fatalf("requeued %d rows", n)
	}
	fatalIf(t, waitPublished(ctx, pub, bad1.ID, bad2.ID), "the re-driven aggregate published")
	if got := byAggregate(pub.Messages(), "bad"); !slices.Equal(got, []uuid.UUID{bad1.ID, bad2.ID}) {
		t.Fatalf("aggregate bad published %v, want bad1 then bad2", got)
	}
	testsvc.WaitFor(t, 30*time.Second, "everything marked", func() bool {
		return db.count(t, "outbox WHERE published_at IS NULL") == 0
	})
}

// relayBrokerAway: a broker that fails whole calls, then one that answers
// no message in time (per-message deadlines, as Kafka reports a broker
// away), for far more attempts than QuarantineAfter: nothing is quarantined
// and no attempt counted; once it is back, everything is published in order.
func relayBrokerAway[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, 2*time.Minute)
	var evs []idem.Event
	for v := 1; v <= 3; v++ {
		for a := range 10 {
			evs = append(evs, changed(t, fmt.Sprint(a), v))
		}
	}
	insert(t, db, evs...)
	pub := memory.New()
	pub.Fail(errors.New("broker down: connection refused"))
	cfg := quarantineConfig()
	cfg.QuarantineAfter = 2
	r := startRelay(t, db, pub, cfg)
	charged := func() int { return db.count(t, "outbox WHERE quarantined_at IS NOT NULL OR attempts > 0") }
	testsvc.WaitFor(t, 30*time.Second, "many failed calls", func() bool { return pub.Calls() >= 10 || charged() > 0 })
	if n := charged(); n != 0 {
		t.Fatalf("%d rows quarantined or charged an attempt while the broker failed whole calls", n)
	}

	pub.SetFunc(func(int, []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			return fmt.Errorf("produce %s: %w", m.EventID, context.DeadlineExceeded)
		}}
	})
	pub.Recover()
	calls := pub.Calls()
	testsvc.WaitFor(t, 30*time.Second, "many calls without an answer", func() bool { return pub.Calls() >= calls+10 || charged() > 0 })
	if n := charged(); n != 0 {
		t.Fatalf("%d rows quarantined or charged an attempt while the broker answered no message in time", n)
	}
	if n := db.count(t, "outbox WHERE last_error IS NOT NULL"); n == 0 {
		t.Errorf("no row keeps the broker's error")
	}

	pub.SetFunc(nil)
	fatalIf(t, waitDistinct(ctx, pub, len(evs)), "everything published once the broker is back")
	testsvc.WaitFor(t, 30*time.Second, "everything marked", func() bool {
		return db.count(t, "outbox WHERE published_at IS NULL") == 0
	})
	if s := r.Stats(); s.Quarantined != 0 || s.PublishErrors == 0 {
		t.Errorf("stats = %+v, want failures counted and nothing quarantined", s)
	}
	checkFirstOrder(t, pub.Messages())
}

// distinct returns the number of distinct events among msgs. A relay
// publishes at least once: a row whose lease ran out before it was marked
// (a loaded machine) is published again, so only distinct events count.
func distinct(msgs []idem.Message) int {
	seen := make(map[uuid.UUID]bool, len(msgs))
	for _, m := range msgs {
		seen[m.EventID] = true
	}
	return len(seen)
}

// waitDistinct waits until pub has published n distinct events.
func waitDistinct(ctx context.Context, pub *memory.Publisher, n int) error {
	return pub.Wait(ctx, func(msgs []idem.Message, _ int) bool { return distinct(msgs) >= n })
}

// waitPublished waits until pub has published each of ids at least once.
func waitPublished(ctx context.Context, pub *memory.Publisher, ids ...uuid.UUID) error {
	return pub.Wait(ctx, func(msgs []idem.Message, _ int) bool {
		seen := make(map[uuid.UUID]bool, len(msgs))
		for _, m := range msgs {
			seen[m.EventID] = true
		}
		for _, id := range ids {
			if !seen[id] {
				return false
			}
		}
		return true
	})
}

// checkFirstOrder fails the test if an aggregate's versions are published
// out of order, looking at each event's first publication.
func checkFirstOrder(t *testing.T, msgs []idem.Message) {
	t.Helper()
	last := map[string]int64{}
	seen := map[uuid.UUID]bool{}
	for _, m := range msgs {
		if seen[m.EventID] {
			continue
		}
		seen[m.EventID] = true
		ev, err := idem.Decode(m)
		fatalIf(t, err, "decode %s", m.Body)
		if ev.AggregateVersion < last[ev.AggregateID] {
			t.Fatalf("aggregate %s: version %d published after %d", ev.AggregateID, ev.AggregateVersion, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.AggregateVersion
	}
}
