// Package logenginetest is the conformance suite of the log relays: the
// scenarios every log source (relay/cdc's PostgreSQL slot, relay/binlog's
// MariaDB binlog) passes through the one engine (relay/internal/logengine),
// as driver/drivertest runs against every dialect. A source's tests call Run
// with a small Harness: how to make a fresh outbox, write to it, count its
// rows and make a relay on it. The checks go through the relay's public
// API only (Start, Stop, Stats, Healthy) and the database: no scenario
// names a source.
//
// It is internal: the engine's Source is internal too, so only this
// module's adapters can pass it. What each log does alone (PostgreSQL's WAL
// messages, failover slots and visibility under a synchronous standby;
// MariaDB's column names, savepoints and purged positions) stays in that
// adapter's own tests.
package logenginetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/startstop/startstoptest"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/logrelay"
)

// Relay is a log relay under test.
type Relay = logrelay.Relay

// Harness is what a log source gives the suite.
type Harness struct {
	// New returns a fresh, migrated outbox of its own (a schema or a
	// database) on the shared test server.
	New func(t *testing.T) Outbox
	// Silent returns a relay whose database is at addr, a server that
	// accepts connections and never answers (stop during start).
	Silent func(t *testing.T, addr string) Relay
	// Serial runs the scenarios one at a time: a source whose first start
	// needs a moment when the log does not move (MariaDB's snapshot at
	// the binlog's end) is not made to wait by the suite itself.
	Serial bool
}

// Outbox is one fresh outbox.
type Outbox struct {
	// Relay returns a relay on the outbox, not started, publishing
	// through pub, with short delays and the options o.
	Relay func(t *testing.T, pub broker.Publisher, o Options) Relay
	// Add writes events in one transaction, committed or, with rollback,
	// rolled back.
	Add func(t *testing.T, rollback bool, events ...idem.Event)
	// Count counts the rows of "table WHERE condition" (the tables
	// outbox and outbox_archive, conditions in SQL both dialects read,
	// with ? for each argument).
	Count func(t *testing.T, fromWhere string, args ...any) int
	// Exec runs a statement on the outbox's database, with ? for each
	// argument.
	Exec func(t *testing.T, query string, args ...any)
	// DB is the outbox's database, migrated, with the outbox's schema.
	DB relay.Database
	// Notices returns outbox.FailureEvents over the outbox, for
	// Options.OnQuarantine.
	Notices func(t *testing.T) func(context.Context, driver.Executor, idem.FailureNotice) error
}

// Options are the relay settings a scenario needs.
type Options struct {
	// Archive keeps the published events in the archive.
	Archive bool
	// QuarantineAfter is Config.QuarantineAfter (0: the default).
	QuarantineAfter int
	// Now is the clock of delayed rows; DueInterval how often they are
	// looked for (0: the defaults).
	Now         func() time.Time
	DueInterval time.Duration
	// OnQuarantine is Config.OnQuarantine.
	OnQuarantine func(context.Context, driver.Executor, idem.FailureNotice) error
}

// Run runs every scenario against the harness's source.
func Run(t *testing.T, h Harness) {
	for _, sc := range []struct {
		name string
		run  func(t *testing.T, ob Outbox)
	}{
		{"InsertsInOrder", insertsInOrder},
		{"RollbackPublishesNothing", rollbackPublishesNothing},
		{"RestartResumes", restartResumes},
		{"StandbyTakesOver", standbyTakesOver},
		{"FirstStartWaitingRows", firstStartWaitingRows},
		{"FirstStartSchemaChange", firstStartSchemaChange},
		{"DelayedRows", delayedRows},
		{"BinaryPayload", binaryPayload},
		{"RefusedQuarantined", refusedQuarantined},
		{"UnreadableQuarantined", unreadableQuarantined},
		{"Archive", archive},
		{"VisibleWhenPublished", visibleWhenPublished},
		{"OperatorPause", operatorPause},
		{"FiguresDuringStart", figuresDuringStart},
		{"QuarantineNotice", quarantineNotice},
	} {
		t.Run(sc.name, func(t *testing.T) {
			if !h.Serial {
				t.Parallel()
			}
			sc.run(t, h.New(t))
		})
	}
	t.Run("StopDuringStart", func(t *testing.T) {
		startstoptest.StopDuringStart(t, func(t *testing.T) (startstoptest.Service, <-chan struct{}) {
			addr, held := startstoptest.SilentListener(t)
			return h.Silent(t, addr), held
		})
	})
}

func start(t *testing.T, ob Outbox, pub broker.Publisher, o Options) Relay {
	t.Helper()
	r := ob.Relay(t, pub, o)
	Start(t, r)
	return r
}

// Start starts r and stops it when the test ends: for a source's own
// tests too.
func Start(t testing.TB, r Relay) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Stop(t, r) })
}

// startStreaming starts a relay and waits until it reads the log: what is
// written then comes from the log, not from the first start's rows.
func startStreaming(t *testing.T, ob Outbox, pub broker.Publisher, o Options) Relay {
	t.Helper()
	r := start(t, ob, pub, o)
	Eventually(t, "relay reading the log", func() bool { return r.Stats().Streaming })
	return r
}

// Stop stops r, failing the test if it does not stop cleanly within 20
// seconds: for a source's own tests too.
func Stop(t testing.TB, r Relay) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// event returns version v of aggregate agg.
func event(t *testing.T, agg string, v int) idem.Event {
	t.Helper()
	ev, err := idem.NewEvent("order.changed.v1", "order", agg, map[string]any{"version": v})
	if err != nil {
		t.Fatal(err)
	}
	ev.AggregateVersion = int64(v)
	return ev
}

// add writes versions from..to of aggregate agg, one transaction each.
func add(t *testing.T, ob Outbox, agg string, from, to int) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	for v := from; v <= to; v++ {
		ev := event(t, agg, v)
		ob.Add(t, false, ev)
		ids = append(ids, ev.ID)
	}
	return ids
}

// WaitLen waits until pub holds n messages and returns them: for a
// source's own tests too.
func WaitLen(t *testing.T, pub *memory.Publisher, n int) []idem.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := pub.WaitLen(ctx, n); err != nil {
		t.Fatalf("waiting for %d messages, got %d: %v", n, pub.Len(), err)
	}
	return pub.Messages()
}

// Eventually waits until cond holds, failing the test with what after a
// minute: for a source's own tests too.
func Eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testsvc.WaitFor(t, 60*time.Second, what, cond)
}

// stats waits until the relay's Stats satisfy cond: a message reaches the
// broker a moment before the relay counts it.
func stats(t *testing.T, r Relay, what string, cond func(logrelay.Stats) bool) {
	t.Helper()
	defer func() {
		if t.Failed() {
			t.Logf("stats: %+v", r.Stats())
		}
	}()
	testsvc.WaitFor(t, 60*time.Second, what, func() bool { return cond(r.Stats()) })
}

// published reports whether id is among msgs.
func published(msgs []idem.Message, id uuid.UUID) bool {
	for _, m := range msgs {
		if m.EventID == id {
			return true
		}
	}
	return false
}

// CheckFirstOrder checks that the first copy of each aggregate's events
// in msgs follows their versions, and that every id of want was published:
// for a source's own tests too.
func CheckFirstOrder(t *testing.T, msgs []idem.Message, want []uuid.UUID) {
	t.Helper()
	seen := map[uuid.UUID]bool{}
	last := map[string]int64{}
	for _, m := range msgs {
		if seen[m.EventID] {
			continue
		}
		seen[m.EventID] = true
		ev, err := idem.Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		if v := last[ev.AggregateID]; ev.AggregateVersion <= v {
			t.Fatalf("aggregate %s: version %d published after %d", ev.AggregateID, ev.AggregateVersion, v)
		}
		last[ev.AggregateID] = ev.AggregateVersion
	}
	for _, id := range want {
		if !seen[id] {
			t.Errorf("event %s never published", id)
		}
	}
}

// insertsInOrder: concurrent writers' events are published once each, in
// each aggregate's order; the rows are deleted and the position made
// durable.
func insertsInOrder(t *testing.T, ob Outbox) {
	pub := memory.New()
	r := startStreaming(t, ob, pub, Options{})
	var want []uuid.UUID
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := add(t, ob, fmt.Sprint("agg-", w), 1, 25)
			mu.Lock()
			want = append(want, ids...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	msgs := WaitLen(t, pub, 100)
	CheckFirstOrder(t, msgs, want)
	Eventually(t, "published rows deleted", func() bool { return ob.Count(t, "outbox") == 0 })
	Eventually(t, "position durable", func() bool { return r.Stats().Position != "" })
	stats(t, r, "every message published, deleted, read in its transaction", func(s logrelay.Stats) bool {
		return s.Published == 100 && s.Unreadable == 0 && s.Deleted == 100 && s.Transactions == 100 && s.Streaming
	})
	if err := r.Healthy(); err != nil {
		t.Errorf("Healthy: %v", err)
	}
}

// rollbackPublishesNothing: a rolled-back transaction's events are never
// published; a sentinel committed after it shows the relay read past it.
func rollbackPublishesNothing(t *testing.T, ob Outbox) {
	pub := memory.New()
	r := startStreaming(t, ob, pub, Options{})
	gone := event(t, "a", 1)
	ob.Add(t, true, gone, event(t, "b", 1))
	sentinel := event(t, "a", 2)
	ob.Add(t, false, sentinel)
	msgs := WaitLen(t, pub, 1)
	if len(msgs) != 1 || msgs[0].EventID != sentinel.ID {
		t.Fatalf("published %d messages, want only the sentinel", len(msgs))
	}
	stats(t, r, "the sentinel alone published", func(s logrelay.Stats) bool { return s.Published == 1 && s.Transactions == 1 })
	if n := pub.Len(); n != 1 {
		t.Errorf("%d messages, want only the sentinel", n)
	}
}

// restartResumes: a relay stopped and started again publishes what was
// written meanwhile, from its durable position, and nothing twice.
func restartResumes(t *testing.T, ob Outbox) {
	pub := memory.New()
	r := start(t, ob, pub, Options{})
	first := add(t, ob, "a", 1, 10)
	WaitLen(t, pub, 10)
	Stop(t, r)
	second := add(t, ob, "a", 11, 20)
	startStreaming(t, ob, pub, Options{})
	msgs := WaitLen(t, pub, 20)
	CheckFirstOrder(t, msgs, append(first, second...))
	// A sentinel after everything: once it is published, no copy can follow.
	third := add(t, ob, "a", 21, 21)
	msgs = WaitLen(t, pub, 21)
	CheckFirstOrder(t, msgs, third)
	if len(msgs) != 21 {
		t.Errorf("%d messages, want 21", len(msgs))
	}
}

// standbyTakesOver: two relays on one outbox: one publishes, the other
// waits (healthy, Waiting) and takes over when the first stops.
func standbyTakesOver(t *testing.T, ob Outbox) {
	pubA, pubB := memory.New(), memory.New()
	a := start(t, ob, pubA, Options{})
	Eventually(t, "first relay streaming", func() bool { return a.Stats().Streaming })
	b := start(t, ob, pubB, Options{})
	Eventually(t, "second relay waiting", func() bool { return b.Stats().Waiting })
	if err := b.Healthy(); err != nil {
		t.Errorf("a standby is healthy: %v", err)
	}
	first := add(t, ob, "a", 1, 10)
	WaitLen(t, pubA, 10)
	if b.Stats().Streaming || pubB.Len() != 0 {
		t.Fatalf("the second relay published while the first held the log: %d", pubB.Len())
	}
	Stop(t, a)
	Eventually(t, "second relay streaming", func() bool { return b.Stats().Streaming })
	second := add(t, ob, "a", 11, 20)
	msgs := WaitLen(t, pubB, 10)
	CheckFirstOrder(t, append(pubA.Messages(), msgs...), append(first, second...))
	if b.Stats().Waiting {
		t.Error("the relay that took over still says Waiting")
	}
}

// firstStartWaitingRows: rows written before the relay's first start,
// which the log it reads from then will not send, are published first, in
// order, then the log's; Stats counts them.
func firstStartWaitingRows(t *testing.T, ob Outbox) {
	before := add(t, ob, "a", 1, 30)
	pub := memory.New()
	r := start(t, ob, pub, Options{})
	after := add(t, ob, "a", 31, 40)
	msgs := WaitLen(t, pub, 40)
	CheckFirstOrder(t, msgs, append(before, after...))
	Eventually(t, "published rows deleted", func() bool { return ob.Count(t, "outbox") == 0 })
	if len(msgs) != 40 {
		t.Errorf("%d messages, want 40 (no copy after a clean run)", len(msgs))
	}
	// The rows added after Start may be in the first start's snapshot too.
	stats(t, r, "all of the 30 to 40 rows the snapshot held counted", func(s logrelay.Stats) bool {
		return s.InitialRows >= 30 && s.InitialRows <= 40 && s.InitialDone == s.InitialRows
	})
}

// firstStartSchemaChange: an ALTER TABLE of the outbox while the relay
// publishes the rows waiting at its first start waits for nothing of the
// relay's. A transaction held over the publishing would keep the table's
// lock: the ALTER would wait for its end, and every writer of the table,
// the relay's deletes included, would queue behind the ALTER. The
// publisher holds the first page until the ALTER is done, or gives up
// after 30 s, which fails the test. The rows before and after the ALTER
// are all published.
func firstStartSchemaChange(t *testing.T, ob Outbox) {
	before := add(t, ob, "a", 1, 5)
	pub := memory.New()
	g := &gate{Publisher: pub, called: make(chan struct{}), open: make(chan struct{})}
	gaveUp := time.AfterFunc(30*time.Second, g.Open)
	defer gaveUp.Stop()
	start(t, ob, g, Options{})
	select {
	case <-g.called:
	case <-time.After(60 * time.Second):
		t.Fatal("the waiting rows were not published")
	}
	ob.Exec(t, "ALTER TABLE outbox ADD COLUMN tenant VARCHAR(36) NULL")
	if !gaveUp.Stop() {
		t.Fatal("the ALTER TABLE waited for the relay to publish the waiting rows")
	}
	g.Open()
	after := add(t, ob, "a", 6, 8)
	msgs := WaitLen(t, pub, 8)
	CheckFirstOrder(t, msgs, append(before, after...))
	Eventually(t, "published rows deleted", func() bool { return ob.Count(t, "outbox") == 0 })
}

// gate holds every Publish call until Open, and closes called at the
// first.
type gate struct {
	broker.Publisher
	first, opened sync.Once
	called, open  chan struct{}
}

func (g *gate) Publish(ctx context.Context, msgs []idem.Message) error {
	g.first.Do(func() { close(g.called) })
	select {
	case <-g.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Publisher.Publish(ctx, msgs)
}

// Open lets the calls through.
func (g *gate) Open() { g.opened.Do(func() { close(g.open) }) }

// delayedRows: a delayed row waits in the table, holds back nothing of its
// aggregate, and is published by the relay once due, then deleted.
func delayedRows(t *testing.T, ob Outbox) {
	pub := memory.New()
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	r := startStreaming(t, ob, pub, Options{DueInterval: 20 * time.Millisecond, Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	d := event(t, "a", 1)
	d.NotBefore = time.Now().Add(time.Hour)
	ob.Add(t, false, d)
	a2, s1 := event(t, "a", 2), event(t, "s", 1)
	ob.Add(t, false, a2, s1)
	msgs := WaitLen(t, pub, 2)
	if published(msgs, d.ID) {
		t.Fatal("the delayed event was published before its time")
	}
	Eventually(t, "the delayed insert counted", func() bool { return r.Stats().Delayed == 1 })
	if n := ob.Count(t, "outbox WHERE id = ?", d.ID.String()); n != 1 {
		t.Fatalf("the delayed row: %d rows, want it waiting in the table", n)
	}
	clock.Store(d.NotBefore.Add(time.Second).UnixNano())
	msgs = WaitLen(t, pub, 3)
	if !published(msgs, d.ID) {
		t.Fatal("the due event was not published")
	}
	Eventually(t, "the due row deleted", func() bool { return ob.Count(t, "outbox WHERE id = ?", d.ID.String()) == 0 })
	stats(t, r, "the due row counted", func(s logrelay.Stats) bool { return s.DuePublished == 1 && s.Published == 3 })
}

// binaryPayload: an event whose payload is not JSON is published with its
// content type and every byte value exactly, from the log and from the
// first start's rows.
func binaryPayload(t *testing.T, ob Outbox) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	binary := func(agg string) idem.Event {
		ev := event(t, agg, 1)
		ev.Payload, ev.ContentType = all, "application/octet-stream"
		return ev
	}
	waiting := binary("waiting")
	ob.Add(t, false, waiting)
	pub := memory.New()
	startStreaming(t, ob, pub, Options{})
	streamed := binary("streamed")
	ob.Add(t, false, streamed)
	msgs := WaitLen(t, pub, 2)
	for _, m := range msgs {
		ev, err := idem.Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		if ev.ContentType != "application/octet-stream" || string(ev.Payload) != string(all) {
			t.Errorf("message %s: content type %q, payload %q; want every byte value", m.EventID, ev.ContentType, ev.Payload)
		}
	}
	CheckFirstOrder(t, msgs, []uuid.UUID{waiting.ID, streamed.ID})
}

// refusedQuarantined: a message the broker refuses QuarantineAfter times
// is quarantined in the table, and the later messages of its aggregate go
// on; so is a refused row waiting at the first start.
func refusedQuarantined(t *testing.T, ob Outbox) {
	bad1, bad2, good := event(t, "bad", 1), event(t, "bad", 2), event(t, "bad", 3)
	ob.Add(t, false, bad1) // waiting at the first start
	pub := memory.New()
	pub.SetFunc(func(_ int, _ []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			if m.EventID == bad1.ID || m.EventID == bad2.ID {
				return broker.Refused(errors.New("no route"))
			}
			return nil
		}}
	})
	r := startStreaming(t, ob, pub, Options{QuarantineAfter: 2})
	ob.Add(t, false, bad2)
	ob.Add(t, false, good)
	msgs := WaitLen(t, pub, 1)
	if msgs[0].EventID != good.ID {
		t.Fatalf("published %s, want only version 3", msgs[0].EventID)
	}
	Eventually(t, "both refused rows quarantined", func() bool {
		return ob.Count(t, "outbox WHERE quarantined_at IS NOT NULL AND last_error LIKE '%refused by the broker%'") == 2
	})
	Eventually(t, "the published row deleted", func() bool { return ob.Count(t, "outbox WHERE id = ?", good.ID.String()) == 0 })
	stats(t, r, "two quarantined, one published", func(s logrelay.Stats) bool { return s.Quarantined == 2 && s.Published == 1 })
}

// unreadableQuarantined: a row that cannot become a message (headers that
// are not an object) is quarantined at once, and the relay goes on.
func unreadableQuarantined(t *testing.T, ob Outbox) {
	pub := memory.New()
	r := startStreaming(t, ob, pub, Options{})
	bad := uuid.NewString()
	ob.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers)
VALUES (?, 'order', 'a', 'order.changed.v1', '{}', '[1,2]')`, bad)
	sentinel := event(t, "a", 2)
	ob.Add(t, false, sentinel)
	msgs := WaitLen(t, pub, 1)
	if msgs[0].EventID != sentinel.ID {
		t.Fatalf("published %s, want the sentinel", msgs[0].EventID)
	}
	Eventually(t, "the unreadable row quarantined", func() bool {
		return ob.Count(t, "outbox WHERE id = ? AND quarantined_at IS NOT NULL AND last_error LIKE '%headers%'", bad) == 1
	})
	stats(t, r, "one unreadable row quarantined", func(s logrelay.Stats) bool { return s.Unreadable == 1 && s.Quarantined == 1 })
}

// archive: with the archive on, every published event, from the first
// start's rows and from the log, is archived once, in the statement or
// transaction that deletes its row.
func archive(t *testing.T, ob Outbox) {
	waiting := add(t, ob, "a", 1, 3)
	pub := memory.New()
	r := startStreaming(t, ob, pub, Options{Archive: true})
	streamed := add(t, ob, "a", 4, 6)
	WaitLen(t, pub, 6)
	Eventually(t, "archived", func() bool { return r.Stats().Archived == 6 && ob.Count(t, "outbox") == 0 })
	for _, id := range append(waiting, streamed...) {
		if n := ob.Count(t, "outbox_archive WHERE id = ?", id.String()); n != 1 {
			t.Errorf("event %s archived %d times, want 1", id, n)
		}
	}
}

// visibleWhenPublished: when the broker gets a message, its row's
// transaction is visible to any other session (G13): a consumer that reads
// the producer's database finds what the event says.
func visibleWhenPublished(t *testing.T, ob Outbox) {
	pub := memory.New()
	var invisible atomic.Int64
	pub.SetFunc(func(_ int, msgs []idem.Message) memory.Action {
		for _, m := range msgs {
			if ob.Count(t, "outbox WHERE id = ?", m.EventID.String()) != 1 {
				invisible.Add(1)
			}
		}
		return memory.Action{}
	})
	startStreaming(t, ob, pub, Options{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); add(t, ob, fmt.Sprint("agg-", w), 1, 25) }()
	}
	wg.Wait()
	WaitLen(t, pub, 100)
	if n := invisible.Load(); n != 0 {
		t.Errorf("%d messages reached the broker before their row was visible to another session", n)
	}
}

// operatorPause: a relay paused by an operator (relay.PauseStore) does not
// take the log while paused, holds what it reads once streaming, stops
// while paused keeping its position, and publishes everything, in order,
// once resumed.
func operatorPause(t *testing.T, ob Outbox) {
	ctx := testsvc.Ctx(t, 2*time.Minute)
	pauses := relay.NewPauseStore(ob.DB)
	pause := func() {
		t.Helper()
		if err := pauses.Pause(ctx, idem.OutboxTableDefault, idem.Pause{Reason: "carrier maintenance", By: "ops"}); err != nil {
			t.Fatal(err)
		}
	}
	resume := func() {
		t.Helper()
		if ok, err := pauses.Resume(ctx, idem.OutboxTableDefault); err != nil || !ok {
			t.Fatalf("resume: %v, %v; want true, nil", ok, err)
		}
	}
	paused := func(s logrelay.Stats) bool { return s.Paused != nil && s.Paused.Reason == "carrier maintenance" }
	pub := memory.New()

	// Paused at its first start: it waits before taking the log, healthy.
	// Stop is the sentinel: once it returns, nothing more is published.
	first := add(t, ob, "a", 1, 2)
	pause()
	r := ob.Relay(t, pub, Options{})
	Start(t, r)
	stats(t, r, "the first start paused", paused)
	if err := r.Healthy(); err != nil {
		t.Errorf("a paused relay is unhealthy: %v", err)
	}
	Stop(t, r)
	if n := pub.Len(); n != 0 {
		t.Fatalf("a paused relay published %d messages at its first start", n)
	}
	if n := ob.Count(t, "outbox"); n != 2 {
		t.Fatalf("%d rows left in the outbox after a paused first start, want 2", n)
	}

	resume()
	r = startStreaming(t, ob, pub, Options{})
	CheckFirstOrder(t, WaitLen(t, pub, 2), first)

	// Paused while reading the log: what it reads waits in the window.
	pause()
	stats(t, r, "the streaming relay paused", paused)
	second := add(t, ob, "a", 3, 4)
	stats(t, r, "the log's rows held by the pause", func(s logrelay.Stats) bool { return paused(s) && s.InFlight == 2 })
	Stop(t, r)
	if n := pub.Len(); n != 2 {
		t.Fatalf("a paused relay published %d messages from the log, want the 2 of before its pause", n)
	}

	// A restart keeps the position: the rows come from the log once
	// resumed, in order.
	r = ob.Relay(t, pub, Options{})
	Start(t, r)
	stats(t, r, "the restarted relay paused", paused)
	resume()
	msgs := WaitLen(t, pub, 4)
	CheckFirstOrder(t, msgs, append(first, second...))
	stats(t, r, "the pause seen ended", func(s logrelay.Stats) bool { return s.Paused == nil })
	third := add(t, ob, "a", 5, 5)
	msgs = WaitLen(t, pub, 5)
	CheckFirstOrder(t, msgs, third)
	if len(msgs) != 5 {
		t.Errorf("%d messages, want 5", len(msgs))
	}
}

// figuresDuringStart: Stats and Healthy, which metrics and health
// endpoints call at any time, may run while Start sets the relay up (the
// race detector checks it).
func figuresDuringStart(t *testing.T, ob Outbox) {
	r := ob.Relay(t, memory.New(), Options{})
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		for {
			select {
			case <-done:
				return
			default:
			}
			_ = r.Stats()
			_ = r.Healthy()
		}
	}()
	Start(t, r)
	Eventually(t, "the relay streaming", func() bool { return r.Stats().Streaming })
	close(done)
	<-ended
}

// quarantineNotice: with Config.OnQuarantine writing notices into the
// outbox (outbox.FailureEvents), each row the relay quarantines, refused
// or unreadable, writes its notice in the quarantine's transaction, and
// the relay reads it from the log and publishes it: once, even after a
// hook that failed (the quarantine rolled back, the row tried again).
func quarantineNotice(t *testing.T, ob Outbox) {
	refused := event(t, "bad", 1)
	pub := memory.New()
	pub.SetFunc(func(_ int, _ []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			if m.EventID == refused.ID {
				return broker.Refused(errors.New("no route"))
			}
			return nil
		}}
	})
	events := ob.Notices(t)
	var calls atomic.Int64
	hook := func(ctx context.Context, ex driver.Executor, n idem.FailureNotice) error {
		if calls.Add(1) == 1 {
			return errors.New("the first notice fails")
		}
		return events(ctx, ex, n)
	}
	r := startStreaming(t, ob, pub, Options{QuarantineAfter: 1, OnQuarantine: hook})
	ob.Add(t, false, refused)
	odd := uuid.NewString()
	ob.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers)
VALUES (?, 'order', 'odd', 'order.changed.v1', '{}', '[1,2]')`, odd)
	sentinel := event(t, "good", 1)
	ob.Add(t, false, sentinel)
	Eventually(t, "both rows quarantined", func() bool {
		return ob.Count(t, "outbox WHERE quarantined_at IS NOT NULL") == 2
	})
	// The notices and the sentinel; then a second sentinel after them:
	// once it is published, no notice can follow.
	WaitLen(t, pub, 3)
	last := event(t, "good", 2)
	ob.Add(t, false, last)
	msgs := WaitLen(t, pub, 4)
	notices := map[string]idem.FailureNotice{}
	for _, m := range msgs {
		if m.EventName != idem.FailureRowQuarantined {
			continue
		}
		ev, err := idem.Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		var n idem.FailureNotice
		if err := json.Unmarshal(ev.Payload, &n); err != nil {
			t.Fatal(err)
		}
		if _, twice := notices[n.AggregateID]; twice {
			t.Errorf("two notices of the row of aggregate %s", n.AggregateID)
		}
		notices[n.AggregateID] = n
	}
	bad, unreadable := notices["bad"], notices["odd"]
	if bad.Class != "refused" || bad.EventID != refused.ID || bad.OutboxTable != idem.OutboxTableDefault || bad.OutboxSeq == 0 ||
		!strings.Contains(bad.Error, "no route") || len(bad.Group) != 12 || bad.Body != nil {
		t.Errorf("the refused row's notice = %+v", bad)
	}
	if unreadable.Class != "unreadable" || unreadable.OutboxSeq == 0 || unreadable.OutboxSeq == bad.OutboxSeq {
		t.Errorf("the unreadable row's notice = %+v", unreadable)
	}
	if len(notices) != 2 || calls.Load() < 3 {
		t.Errorf("%d notices published, %d hook calls; want 2 notices after 3 calls or more", len(notices), calls.Load())
	}
	stats(t, r, "two quarantined", func(s logrelay.Stats) bool { return s.Quarantined == 2 })
}
