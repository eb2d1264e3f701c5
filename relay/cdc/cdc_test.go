package cdc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/logrelay"
)

// Rows inserted by another program with Debezium's five columns only, as
// psql would, are published with idem's defaults, and deleted once
// confirmed.
func TestDebeziumColumnsPublished(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	start(t, pg, pub, fastConfig(t))

	id := uuid.New()
	pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES ($1, 'order', '42', 'order.order.placed.v1', '{"total": 12.5}')`, id)
	msgs := waitLen(t, pub, 1, 20*time.Second)
	ev := decode(t, msgs[0])
	if ev.ID != id || ev.Name != "order.order.placed.v1" || ev.AggregateType != "order" || ev.AggregateID != "42" {
		t.Fatalf("published %+v", ev)
	}
	var payload map[string]float64
	if err := json.Unmarshal(ev.Payload, &payload); err != nil || payload["total"] != 12.5 {
		t.Fatalf("payload %s (%v)", ev.Payload, err)
	}
	if ev.OccurredAt.IsZero() || time.Since(ev.OccurredAt) > time.Minute {
		t.Fatalf("occurred_at %v", ev.OccurredAt)
	}
	eventually(t, 10*time.Second, "the published row deleted", func() bool { return pg.Count(t, "outbox") == 0 })
}

// WAL messages written by another program in SQL, as docs/OPERATIONS.md
// shows, are published like NewLogWriter's: occurred_at as JSON gives
// (to_json of a timestamptz), as now()::text gives, or left out (the commit
// time then).
func TestWALMessagesWrittenInSQL(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	start(t, pg, pub, fastConfig(t))

	ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	// One transaction, three messages: occurred_at as to_json gives it,
	// as now()::text gives it, and left out.
	tx, err := pg.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // committed below
	for i, occurredAt := range []string{`, 'occurred_at', now()`, `, 'occurred_at', now()::text`, ``} {
		if _, err := tx.Exec(context.Background(), `SELECT pg_logical_emit_message(true, $1,
    json_build_object('id', $2::uuid, 'aggregatetype', 'order', 'aggregateid', '42',
        'type', 'order.order.changed.v1', 'payload', json_build_object('total', 12.5)`+occurredAt+`)::text)`,
			pg.Schema, ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	msgs := waitLen(t, pub, 3, 20*time.Second)
	for i, m := range msgs {
		ev := decode(t, m)
		if ev.ID != ids[i] || ev.AggregateID != "42" || ev.OccurredAt.IsZero() || time.Since(ev.OccurredAt) > time.Minute {
			t.Errorf("message %d: %+v, want event %s with a recent occurred_at", i, ev, ids[i])
		}
	}
	streamedPast(t, pg, "the position confirmed past the messages")
	if s := pub.Messages(); len(s) != 3 {
		t.Fatalf("%d messages, want 3", len(s))
	}
	if n := pg.Count(t, "outbox"); n != 0 {
		t.Fatalf("%d rows in the outbox (quarantined?), want none", n)
	}
}

// Rows that cannot become messages are quarantined in the table, and the
// rows after them are published.
func TestUnreadableRowQuarantined(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	r := start(t, pg, pub, fastConfig(t))

	pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers)
		VALUES ($1, 'order', '1', 'order.order.placed.v1', '{}', '[1,2]')`, uuid.New())
	good := event(t, "2", 1)
	if err := outbox.NewWriter(pg.Driver).AddExec(context.Background(), pg.Driver.Pool(), good); err != nil {
		t.Fatal(err)
	}
	msgs := waitLen(t, pub, 1, 20*time.Second)
	if msgs[0].EventID != good.ID {
		t.Fatalf("published %s, want %s", msgs[0].EventID, good.ID)
	}
	eventually(t, 10*time.Second, "one quarantined row left", func() bool {
		return pg.Count(t, "outbox") == 1 && pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL AND last_error LIKE '%headers%'") == 1
	})
	if s := r.Stats(); s.Quarantined != 1 || s.Unreadable != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestForeignColumnTypeDoesNotStopTheRelay: a table whose occurred_at is
// text, as another program's outbox may have it, holds a row whose value
// idem cannot read: the relay sets that row aside (logged with its
// content) and publishes the next, rather than fail on it at every
// reconnection.
func TestForeignColumnTypeDoesNotStopTheRelay(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pg.Exec(t, `ALTER TABLE outbox ALTER COLUMN occurred_at DROP DEFAULT, ALTER COLUMN occurred_at TYPE text USING occurred_at::text`)
	pub := memory.New()
	r := start(t, pg, pub, fastConfig(t))
	pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, occurred_at)
		VALUES ($1, 'order', '1', 'order.order.placed.v1', '{}', 'last tuesday')`, uuid.New())
	good := uuid.New()
	pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, occurred_at)
		VALUES ($1, 'order', '2', 'order.order.placed.v1', '{}', now()::text)`, good)
	msgs := waitLen(t, pub, 1, 20*time.Second)
	if msgs[0].EventID != good {
		t.Fatalf("published %s, want %s", msgs[0].EventID, good)
	}
	if s := r.Stats(); s.Unreadable != 1 || !s.Streaming {
		t.Fatalf("stats %+v, want 1 unreadable and the relay streaming", s)
	}
}

// TestUnreadableWALMessageQuarantined: a WAL message with the outbox's
// prefix that cannot become a message is kept, with its content, as a
// quarantined row ("idem failed list --relay" reads it), and the log goes
// on.
func TestUnreadableWALMessageQuarantined(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	r := start(t, pg, pub, fastConfig(t))
	garbage := "not json \x00\xff at all"
	pg.Exec(t, `SELECT pg_logical_emit_message(true, $1, $2::bytea)`, pg.Schema, []byte(garbage))
	good := event(t, "2", 1)
	lw, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if err := lw.AddExec(context.Background(), pg.Driver.Pool(), good); err != nil {
		t.Fatal(err)
	}
	msgs := waitLen(t, pub, 1, 20*time.Second)
	if msgs[0].EventID != good.ID {
		t.Fatalf("published %s, want %s", msgs[0].EventID, good.ID)
	}
	eventually(t, 10*time.Second, "the WAL message kept as a quarantined row", func() bool {
		return pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL") == 1
	})
	q, err := pg.Driver.Dialect().ListQuarantined(context.Background(), pg.Driver.Pool(), driver.QuarantineFilter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != 1 || !strings.Contains(q[0].LastError, strconv.Quote(garbage)) || !strings.Contains(q[0].LastError, "not a JSON object") {
		t.Fatalf("quarantined %+v, want one row whose last error holds the content %s", q, strconv.Quote(garbage))
	}
	if s := r.Stats(); s.Quarantined != 1 || s.Unreadable != 1 {
		t.Fatalf("stats %+v", s)
	}
	streamedPast(t, pg, "the position confirmed past the quarantined row")
	if n := pub.Len(); n != 1 {
		t.Fatalf("%d messages published, want 1: the quarantined row is not published", n)
	}
}

// WAL-message mode: a rolled-back transaction publishes nothing; committed
// ones publish each of their events once, in order, mixed with table rows in
// commit order.
func TestLogWriter(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	r := start(t, pg, pub, fastConfig(t))
	lw, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	tw := outbox.NewWriter(pg.Driver)
	ctx := context.Background()
	var want []uuid.UUID
	commit := func(commit bool, add func(tx pgx.Tx)) {
		t.Helper()
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		add(tx)
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		} else if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	add := func(w *outbox.Writer[pgx.Tx], tx pgx.Tx, keep bool, evs ...idem.Event) {
		t.Helper()
		if err := w.Add(ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if keep {
			for _, ev := range evs {
				want = append(want, ev.ID)
			}
		}
	}
	commit(true, func(tx pgx.Tx) { add(tw, tx, true, event(t, "a", 1)) })
	commit(false, func(tx pgx.Tx) { add(lw, tx, false, event(t, "a", 2), event(t, "b", 1)) })
	commit(true, func(tx pgx.Tx) { add(lw, tx, true, event(t, "a", 2), event(t, "a", 3), event(t, "b", 1)) })
	commit(true, func(tx pgx.Tx) {
		add(lw, tx, true, event(t, "c", 1))
		add(tw, tx, true, event(t, "a", 4))
		add(lw, tx, true, event(t, "c", 2))
	})
	// A message of another prefix is not ours.
	pg.Exec(t, `SELECT pg_logical_emit_message(true, 'someone.else', 'hello')`)
	commit(false, func(tx pgx.Tx) { add(tw, tx, false, event(t, "d", 1)) })
	commit(true, func(tx pgx.Tx) { add(lw, tx, true, event(t, "b", 2)) })

	waitLen(t, pub, len(want), 20*time.Second)
	// Let anything extra arrive before checking there is nothing extra.
	eventually(t, 10*time.Second, "everything confirmed", func() bool {
		s := r.Stats()
		return s.InFlight == 0 && pg.Count(t, "outbox") == 0
	})
	msgs := pub.Messages()
	if len(msgs) != len(want) {
		t.Fatalf("%d messages published, want %d", len(msgs), len(want))
	}
	// One Publish call may reorder its messages: compare per aggregate, and
	// check each message came once.
	pos := map[uuid.UUID]int{}
	for i, m := range msgs {
		if _, dup := pos[m.EventID]; dup {
			t.Fatalf("event %s published twice", m.EventID)
		}
		pos[m.EventID] = i
	}
	for _, id := range want {
		if _, ok := pos[id]; !ok {
			t.Fatalf("event %s not published", id)
		}
	}
	checkFirstOrder(t, msgs)
	// The WAL message is published exactly as the row of the same event
	// would be.
	for _, m := range msgs {
		ev := decode(t, m)
		if ev.AggregateType != "order" || ev.Name != "order.order.changed.v1" || ev.OccurredAt.IsZero() {
			t.Fatalf("message %+v", ev)
		}
	}
}

// NewLogWriter refuses dialects that cannot write into their log; on
// PostgreSQL through database/sql, the events are published like through pgx.
func TestLogWriterDialects(t *testing.T) {
	t.Parallel()
	lite := testdb.NewSQLite(t, testdb.Options{NoMigrate: true})
	if _, err := outbox.NewLogWriter(lite.Driver, ""); !errors.Is(err, outbox.ErrNotSupported) {
		t.Fatalf("SQLite: %v", err)
	}
	pg := newDB(t)
	pub := memory.New()
	start(t, pg, pub, fastConfig(t))
	sqlDrv := postgres.NewSQL(pg.DB)
	lw, err := outbox.NewLogWriter(sqlDrv, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	evs := []idem.Event{event(t, "a", 1), event(t, "b", 1), event(t, "c", 1)}
	if err := lw.AddExec(context.Background(), sqlDrv.Pool(), evs...); err != nil {
		t.Fatal(err)
	}
	if err := lw.AddExec(context.Background(), sqlDrv.Pool(), event(t, "a", 2)); err != nil {
		t.Fatal(err)
	}
	msgs := waitLen(t, pub, 4, 20*time.Second)
	checkFirstOrder(t, msgs)
	if pg.Count(t, "outbox") != 0 {
		t.Fatal("the log writer wrote rows")
	}
}

// A publisher that fails whole calls, then refuses some messages: every
// event is published, each aggregate's in order, and no later event of an
// aggregate is accepted before an earlier one.
func TestPublishFailuresRetriedInOrder(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	var refusals atomic.Int64
	pub.SetFunc(func(call int, msgs []idem.Message) memory.Action {
		if call%3 == 1 {
			return memory.Action{Err: errors.New("broker away")}
		}
		return memory.Action{Refuse: func(m idem.Message) error {
			if m.EventID[15]%4 == 0 && refusals.Add(1) < 200 {
				return errors.New("nack")
			}
			return nil
		}}
	})
	cfg := fastConfig(t)
	cfg.Window = 50
	cfg.BatchSize = 10
	cfg.QuarantineAfter = -1 // refused messages are retried for ever
	start(t, pg, pub, cfg)
	w := outbox.NewWriter(pg.Driver)
	want := map[uuid.UUID]bool{}
	const aggs, versions = 10, 20
	for v := 1; v <= versions; v++ {
		var evs []idem.Event
		for a := range aggs {
			ev := event(t, fmt.Sprint(a), v)
			want[ev.ID] = true
			evs = append(evs, ev)
		}
		if err := w.AddExec(context.Background(), pg.Driver.Pool(), evs...); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := pub.Wait(ctx, func(msgs []idem.Message, _ int) bool {
		got := map[uuid.UUID]bool{}
		for _, m := range msgs {
			got[m.EventID] = true
		}
		return len(got) == len(want)
	})
	if err != nil {
		t.Fatalf("%d of %d published: %v", pub.Len(), len(want), err)
	}
	msgs := pub.Messages()
	checkAll(t, msgs, want)
	checkFirstOrder(t, msgs)
	if len(msgs) != len(want) {
		t.Fatalf("%d messages accepted for %d events: a refused or failed message is accepted once, when retried", len(msgs), len(want))
	}
}

// The slot's confirmed position never passes a message the broker has not
// confirmed, while later messages of other aggregates are published; the
// rows of those later transactions stay until it is.
func TestConfirmedNeverPassesUnconfirmed(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	hang := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hang) }) }
	defer release()
	var stuckID atomic.Pointer[uuid.UUID]
	pub.SetFunc(func(call int, msgs []idem.Message) memory.Action {
		for _, m := range msgs {
			if p := stuckID.Load(); p != nil && m.EventID == *p {
				return memory.Action{Hang: hang}
			}
		}
		return memory.Action{}
	})
	cfg := fastConfig(t)
	cfg.PublishTimeout = time.Minute
	cfg.BatchSize = 1
	r := start(t, pg, pub, cfg)
	w := outbox.NewWriter(pg.Driver)
	ctx := context.Background()

	before := event(t, "x", 1)
	if err := w.AddExec(ctx, pg.Driver.Pool(), before); err != nil {
		t.Fatal(err)
	}
	waitLen(t, pub, 1, 20*time.Second)
	slot := cdc.SlotName(idem.Tables{Schema: pg.Schema})
	eventually(t, 10*time.Second, "the first event confirmed", func() bool { return pg.Count(t, "outbox") == 0 })

	ev := event(t, "stuck", 1)
	stuck := ev.ID
	stuckID.Store(&stuck)
	if err := w.AddExec(ctx, pg.Driver.Pool(), ev); err != nil {
		t.Fatal(err)
	}
	stuckEnd := currentLSN(t, pg)
	var later []idem.Event
	for i := range 20 {
		e := event(t, fmt.Sprint("later-", i), 1)
		later = append(later, e)
		if err := w.AddExec(ctx, pg.Driver.Pool(), e); err != nil {
			t.Fatal(err)
		}
	}
	msgs := waitLen(t, pub, 1+len(later), 20*time.Second)
	for _, m := range msgs {
		if m.EventID == stuck {
			t.Fatal("the stuck message was accepted")
		}
	}
	// Once the relay has the broker's answers for the later rows and has
	// reported its position since, that position must still be before the
	// stuck transaction's commit, and the later rows stay.
	eventually(t, 10*time.Second, "the later rows' answers taken", func() bool {
		return r.Stats().Published == int64(1+len(later))
	})
	statusSentAfterNow(t, pg, slot)
	if got := confirmedLSN(t, pg, slot); got >= stuckEnd {
		t.Fatalf("confirmed %s, past the unconfirmed transaction ending at %s", got, stuckEnd)
	}
	if n := pg.Count(t, "outbox"); n != 1+len(later) {
		t.Fatalf("%d rows left, want %d: rows are deleted only with their transaction's position", n, 1+len(later))
	}
	release()
	waitLen(t, pub, 2+len(later), 20*time.Second)
	eventually(t, 10*time.Second, "every row deleted and the position past them", func() bool {
		return pg.Count(t, "outbox") == 0 && confirmedLSN(t, pg, slot) >= stuckEnd
	})
	if s := r.Stats(); s.InFlight != 0 || s.Published != int64(2+len(later)) {
		t.Fatalf("stats %+v", s)
	}
}

// The walsender killed (pg_terminate_backend) several times while events are
// written: the relay reconnects and resumes from the slot; every event is
// published, each aggregate in order.
func TestConnectionDropResumes(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	cfg := fastConfig(t)
	r := start(t, pg, pub, cfg)
	slot := cdc.SlotName(idem.Tables{Schema: pg.Schema})
	w := outbox.NewWriter(pg.Driver)
	want := map[uuid.UUID]bool{}
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for v := 1; v <= 50; v++ {
			var evs []idem.Event
			for a := range 10 {
				evs = append(evs, event(t, fmt.Sprint(a), v))
			}
			if err := w.AddExec(context.Background(), pg.Driver.Pool(), evs...); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for _, ev := range evs {
				want[ev.ID] = true
			}
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	kills := 0
	for kills < 3 {
		var n int
		err := pg.Pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		kills += n
		time.Sleep(100 * time.Millisecond)
	}
	<-done
	mu.Lock()
	total := len(want)
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := pub.Wait(ctx, func(msgs []idem.Message, _ int) bool {
		got := map[uuid.UUID]bool{}
		for _, m := range msgs {
			got[m.EventID] = true
		}
		return len(got) == total
	})
	if err != nil {
		t.Fatalf("%d messages for %d events: %v", pub.Len(), total, err)
	}
	msgs := pub.Messages()
	checkAll(t, msgs, want)
	checkFirstOrder(t, msgs)
	eventually(t, 10*time.Second, "every row deleted", func() bool { return pg.Count(t, "outbox") == 0 })
	if !r.Stats().Streaming {
		t.Fatalf("not streaming after the kills: %+v", r.Stats())
	}
}

// Two relays on one slot: only one publishes; the other waits, and takes
// over when the first stops.
func TestTwoRelaysOneSlot(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub1, pub2 := memory.New(), memory.New()
	r1 := start(t, pg, pub1, fastConfig(t))
	eventually(t, 10*time.Second, "the first relay streaming", func() bool { return r1.Stats().Streaming })
	r2 := start(t, pg, pub2, fastConfig(t))
	eventually(t, 10*time.Second, "the second relay waiting", func() bool { return r2.Stats().Waiting })
	if err := r2.Healthy(); err != nil {
		t.Fatalf("a waiting relay is healthy: %v", err)
	}
	w := outbox.NewWriter(pg.Driver)
	var first []idem.Event
	for i := range 10 {
		first = append(first, event(t, fmt.Sprint(i), 1))
	}
	if err := w.AddExec(context.Background(), pg.Driver.Pool(), first...); err != nil {
		t.Fatal(err)
	}
	waitLen(t, pub1, len(first), 20*time.Second)
	eventually(t, 10*time.Second, "rows deleted", func() bool { return pg.Count(t, "outbox") == 0 })
	stop(t, r1)
	var second []idem.Event
	for i := range 10 {
		second = append(second, event(t, fmt.Sprint(i), 2))
	}
	if err := w.AddExec(context.Background(), pg.Driver.Pool(), second...); err != nil {
		t.Fatal(err)
	}
	msgs := waitLen(t, pub2, len(second), 20*time.Second)
	if pub2.Len() != len(second) || pub1.Len() != len(first) {
		t.Fatalf("first relay %d messages, second %d", pub1.Len(), pub2.Len())
	}
	for _, m := range msgs {
		if decode(t, m).AggregateVersion != 2 {
			t.Fatalf("the second relay published %s again", m.EventID)
		}
	}
	// The second relay published the rows it found at start, then reads
	// the slot.
	eventually(t, 10*time.Second, "the second relay streaming", func() bool { return r2.Stats().Streaming })
	streamedPast(t, pg, "the second relay's position confirmed past the rows") // a copy from the stream would have come
	if pub2.Len() != len(second) {
		t.Fatalf("the second relay published %d messages, want %d", pub2.Len(), len(second))
	}
}

// KeepRows leaves the rows; a writer that deletes its row in the same
// transaction (Debezium's insert then delete) has its event published.
func TestKeepRowsAndInsertThenDelete(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	cfg := fastConfig(t)
	cfg.Delete = logrelay.KeepRows
	start(t, pg, pub, cfg)
	ctx := context.Background()
	w := outbox.NewWriter(pg.Driver)
	kept := event(t, "1", 1)
	if err := w.AddExec(ctx, pg.Driver.Pool(), kept); err != nil {
		t.Fatal(err)
	}
	gone := event(t, "2", 1)
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(ctx, tx, gone); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, gone.ID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := waitLen(t, pub, 2, 20*time.Second)
	ids := map[uuid.UUID]bool{msgs[0].EventID: true, msgs[1].EventID: true}
	if !ids[kept.ID] || !ids[gone.ID] {
		t.Fatalf("published %v", ids)
	}
	streamedPast(t, pg, "the position confirmed past both events")
	if n := pg.Count(t, "outbox"); n != 1 {
		t.Fatalf("%d rows, want the kept one", n)
	}
}

// Clear start-up errors.
func TestStartErrors(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	_, err := cdc.New(pg.URL, memory.New(), cdc.Config{Tables: idem.Tables{Outbox: "nope"}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := cdc.New(pg.URL, memory.New(), cdc.Config{Tables: idem.Tables{Outbox: "nope"}, Logger: testLogger(t)})
	err = r.Start(context.Background())
	if !errors.Is(err, idem.ErrMissingTable) || !strings.Contains(err.Error(), "idem migrate") {
		t.Fatalf("missing table: %v", err)
	}
	if _, err := cdc.New(pg.URL, memory.New(), cdc.Config{Slot: "Bad-Name"}); err == nil || !strings.Contains(err.Error(), "Config.Slot") {
		t.Fatalf("bad slot name: %v", err)
	}
	err = cdc.DropSlot(context.Background(), pg.URL, "idem_no_such_slot")
	if !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("drop a missing slot: %v", err)
	}
}

// A role without the privileges the relay needs gets errors that say what
// to grant.
func TestPrivilegeErrors(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	role := "idem_t_role_" + strings.TrimPrefix(pg.Schema, "idem_t_")
	pg.Exec(t, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = pg.Pool.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = pg.Pool.Exec(ctx, "DROP ROLE "+role)
	})
	pg.Exec(t, "GRANT USAGE ON SCHEMA "+pg.Schema+" TO "+role)
	pg.Exec(t, "GRANT SELECT, UPDATE ON outbox TO "+role)
	u, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	startErr := func() error {
		r, err := cdc.New(u.String(), memory.New(), cdc.Config{Tables: idem.Tables{Schema: pg.Schema}, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return r.Start(context.Background())
	}
	if err := startErr(); err == nil || !strings.Contains(err.Error(), "GRANT DELETE ON") || !strings.Contains(err.Error(), "--keep-rows") {
		t.Fatalf("without DELETE: %v", err)
	}
	pg.Exec(t, "GRANT DELETE ON outbox TO "+role)
	if err := startErr(); err == nil || !strings.Contains(err.Error(), "GRANT SELECT, INSERT, DELETE ON \""+pg.Schema+"\".\"outbox_archive\"") || !strings.Contains(err.Error(), "--archive-retention 0") {
		t.Fatalf("without the archive's privileges: %v", err)
	}
	pg.Exec(t, "GRANT SELECT, INSERT, DELETE ON outbox_archive TO "+role)
	if err := startErr(); err == nil || !strings.Contains(err.Error(), "CREATE PUBLICATION") || !strings.Contains(err.Error(), "ownership") {
		t.Fatalf("not the table's owner: %v", err)
	}
	slot := cdc.SlotName(idem.Tables{Schema: pg.Schema})
	pg.Exec(t, "CREATE PUBLICATION "+slot+" FOR TABLE outbox WITH (publish = 'insert')")
	if err := startErr(); err == nil || !strings.Contains(err.Error(), "ALTER ROLE "+role+" REPLICATION") {
		t.Fatalf("without REPLICATION: %v", err)
	}
	pg.Exec(t, "ALTER ROLE "+role+" REPLICATION")
	pub := memory.New()
	r, err := cdc.New(u.String(), pub, cdc.Config{Tables: idem.Tables{Schema: pg.Schema}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatalf("with every privilege: %v", err)
	}
	defer stop(t, r)
	ev := event(t, "1", 1)
	if err := outbox.NewWriter(pg.Driver).AddExec(context.Background(), pg.Driver.Pool(), ev); err != nil {
		t.Fatal(err)
	}
	waitLen(t, pub, 1, 20*time.Second)
	eventually(t, 10*time.Second, "the event archived", func() bool { return r.Stats().Archived == 1 })
}

// Stop waits for the broker; past its context it abandons the messages in
// flight, and the next relay on the slot publishes them.
func TestStopAbandonsThenNextRelayPublishes(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	hung := memory.New()
	hang := make(chan struct{})
	defer close(hang)
	hung.SetFunc(func(int, []idem.Message) memory.Action { return memory.Action{Hang: hang} })
	cfg := fastConfig(t)
	cfg.PublishTimeout = time.Minute
	r := start(t, pg, hung, cfg)
	ev := event(t, "1", 1)
	if err := outbox.NewWriter(pg.Driver).AddExec(context.Background(), pg.Driver.Pool(), ev); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the message handed to the broker", func() bool { return r.Stats().InFlight == 1 && hung.Calls() > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := r.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stop: %v", err)
	}
	// Stop returned at its deadline; the abandoned work ends in the
	// background.
	select {
	case <-r.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not end after its Stop ran out of time")
	}
	if pg.Count(t, "outbox") != 1 {
		t.Fatal("the unconfirmed row was deleted")
	}
	pub := memory.New()
	start(t, pg, pub, cfg)
	msgs := waitLen(t, pub, 1, 20*time.Second)
	if msgs[0].EventID != ev.ID {
		t.Fatalf("published %s", msgs[0].EventID)
	}
}

// recorder keeps the messages logged at warn level or above.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelWarn {
		r.mu.Lock()
		r.msgs = append(r.msgs, rec.Message)
		r.mu.Unlock()
	}
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }
func (r *recorder) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// The slot's lag is measured, and a warning logged when it retains more WAL
// than LagWarnBytes.
func TestLagWarning(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	rec := &recorder{}
	cfg := fastConfig(t)
	cfg.Logger = slog.New(rec)
	cfg.StandbyInterval = 100 * time.Millisecond
	cfg.LagWarnBytes = 1
	r := start(t, pg, memory.New(), cfg)
	if err := outbox.NewWriter(pg.Driver).AddExec(context.Background(), pg.Driver.Pool(), event(t, "1", 1)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the retained WAL measured and warned about", func() bool {
		return r.Stats().RetainedBytes > 1 && rec.has("retains more WAL than LagWarnBytes")
	})
}

// Rows already in the outbox when the relay starts for the first time (a
// table the polling relay served, rows written before the slot existed)
// are in no stream of the slot: the relay publishes them at start, in order
// per aggregate, once each, and deletes them, counting them in its Stats.
func TestRowsBeforeTheSlotArePublished(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	w := outbox.NewWriter(pg.Driver)
	var before []idem.Event
	for v := 1; v <= 10; v++ {
		for a := range 5 {
			before = append(before, event(t, fmt.Sprint(a), v))
		}
	}
	if err := w.AddExec(context.Background(), pg.Driver.Pool(), before...); err != nil {
		t.Fatal(err)
	}
	// A row the polling relay published and kept for its retention is not
	// published again.
	pg.Exec(t, `UPDATE outbox SET published_at = now() WHERE seq = (SELECT min(seq) FROM outbox)`)
	pub := memory.New()
	r := start(t, pg, pub, fastConfig(t))
	after := event(t, "0", 11)
	if err := w.AddExec(context.Background(), pg.Driver.Pool(), after); err != nil {
		t.Fatal(err)
	}
	waitLen(t, pub, len(before), 20*time.Second)
	eventually(t, 10*time.Second, "the outbox emptied but for the published row", func() bool { return pg.Count(t, "outbox") == 1 })
	streamedPast(t, pg, "the position confirmed past every row") // a copy from the stream would have come
	msgs := pub.Messages()
	if len(msgs) != len(before) {
		t.Fatalf("published %d messages, want %d (49 found at start, 1 written after): %+v", len(msgs), len(before), r.Stats())
	}
	last := map[string]int64{}
	for _, m := range msgs {
		ev := decode(t, m)
		if ev.AggregateVersion <= last[ev.AggregateID] {
			t.Fatalf("aggregate %s: version %d after %d", ev.AggregateID, ev.AggregateVersion, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.AggregateVersion
	}
	if last["0"] != 11 {
		t.Fatalf("the event written after the start was not published last: %v", last)
	}
	// Counted in the slot's snapshot (the published row aside), and done.
	if s := r.Stats(); s.InitialRows != int64(len(before)-1) || s.InitialDone != s.InitialRows {
		t.Errorf("Stats: InitialRows %d, InitialDone %d; want %d of %[3]d", s.InitialRows, s.InitialDone, len(before)-1)
	}
}

// TestRefusedMessagesQuarantined: a message the broker refuses on
// QuarantineAfter attempts, a table row or a WAL message, is quarantined in
// the outbox, where "idem failed ... --relay" finds it, and the slot's
// position goes on; faults (whole calls failing) never quarantine. Re-driven
// with RequeueQuarantined, each is published once.
func TestRefusedMessagesQuarantined(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	var (
		mu      sync.Mutex
		refuse  = map[uuid.UUID]bool{}
		faulted atomic.Int64
	)
	pub.SetFunc(func(call int, msgs []idem.Message) memory.Action {
		if faulted.Add(1) <= 20 {
			return memory.Action{Err: errors.New("broker away")}
		}
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
	cfg.QuarantineAfter = 3
	r := start(t, pg, pub, cfg)
	lw, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	tw := outbox.NewWriter(pg.Driver)
	ctx := context.Background()
	badRow, badLog := event(t, "bad-row", 1), event(t, "bad-log", 1)
	mu.Lock()
	refuse[badRow.ID], refuse[badLog.ID] = true, true
	mu.Unlock()
	good := []idem.Event{event(t, "good", 1), event(t, "bad-row", 2), event(t, "good", 2), event(t, "bad-log", 2)}
	if err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
		if err := tw.Add(ctx, tx, badRow, good[0]); err != nil {
			return err
		}
		return lw.Add(ctx, tx, badLog)
	}); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
		if err := tw.Add(ctx, tx, good[1], good[2]); err != nil {
			return err
		}
		return lw.Add(ctx, tx, good[3])
	}); err != nil {
		t.Fatal(err)
	}

	written := currentLSN(t, pg)
	waitLen(t, pub, len(good), 30*time.Second)
	eventually(t, 20*time.Second, "two quarantined rows left, the rest deleted", func() bool {
		return pg.Count(t, "outbox") == 2 &&
			pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL AND attempts = 3 AND last_error LIKE '%unroutable%'") == 2
	})
	if s := r.Stats(); s.Quarantined != 2 {
		t.Fatalf("stats %+v, want 2 quarantined", s)
	}
	// The position went past them: the slot holds nothing unconfirmed.
	eventually(t, 10*time.Second, "the position confirmed past the quarantined messages", func() bool {
		return confirmedLSN(t, pg, cdc.SlotName(idem.Tables{Schema: pg.Schema})) >= written
	})
	// The WAL message's quarantined row reads as the row would have.
	d := pg.Driver.Dialect()
	q, err := d.ListQuarantined(ctx, pg.Driver.Pool(), driver.QuarantineFilter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, row := range q {
		if row.ID != badRow.ID && row.ID != badLog.ID {
			t.Fatalf("quarantined %s, want only %s and %s", row.ID, badRow.ID, badLog.ID)
		}
		if row.Type != badLog.Name || row.AggregateType != "order" {
			t.Fatalf("quarantined row %+v", row)
		}
		seqs = append(seqs, row.Seq)
	}
	if len(seqs) != 2 {
		t.Fatalf("ListQuarantined: %d rows, want 2", len(seqs))
	}
	for _, m := range pub.Messages() {
		if m.EventID == badRow.ID || m.EventID == badLog.ID {
			t.Fatalf("refused event %s accepted", m.EventID)
		}
	}

	// Re-driven, with the broker now taking them: published, and deleted.
	mu.Lock()
	clear(refuse)
	mu.Unlock()
	if n, err := d.RequeueQuarantined(ctx, pg.Driver.Pool(), seqs); err != nil || n != 2 {
		t.Fatalf("requeue = %d, %v", n, err)
	}
	msgs := waitLen(t, pub, len(good)+2, 20*time.Second)
	eventually(t, 10*time.Second, "the outbox emptied", func() bool { return pg.Count(t, "outbox") == 0 })
	streamedPast(t, pg, "the position confirmed past the re-driven rows") // a second copy would have come
	if n := pub.Len(); n != len(good)+2 {
		t.Fatalf("%d messages accepted, want %d: each once", n, len(good)+2)
	}
	seen := map[uuid.UUID]int{}
	for _, m := range msgs {
		seen[m.EventID]++
	}
	if seen[badRow.ID] != 1 || seen[badLog.ID] != 1 {
		t.Fatalf("re-driven events accepted %d and %d times, want once each", seen[badRow.ID], seen[badLog.ID])
	}
}

// streamedPast waits until the slot's confirmed position passes the server's
// current position. The relay confirms a position only once every message
// the log held before it is published or quarantined and its row deleted
// (unless KeepRows): whatever it would do with what was written until now
// is then done. It is the barrier after which a test checks that something
// did not happen.
func streamedPast(t *testing.T, pg *testdb.PG, what string) {
	t.Helper()
	lsn := currentLSN(t, pg)
	slot := cdc.SlotName(idem.Tables{Schema: pg.Schema})
	eventually(t, 20*time.Second, what, func() bool { return confirmedLSN(t, pg, slot) >= lsn })
}

// statusSentAfterNow waits until the server has taken two standby status
// updates that the relay reading slot sent after now (pg_stat_replication's
// reply_time): a position the relay would report from what it knows now
// has then reached the slot. The relay sends one every StandbyInterval
// even when its position stays.
func statusSentAfterNow(t *testing.T, pg *testdb.PG, slot string) {
	t.Helper()
	var now time.Time
	if err := pg.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	replyAfter := func(after time.Time) time.Time {
		t.Helper()
		var at time.Time
		eventually(t, 20*time.Second, "a standby status update from the relay", func() bool {
			err := pg.Pool.QueryRow(context.Background(), `SELECT coalesce(max(r.reply_time), 'epoch'::timestamptz)
				FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid
				WHERE s.slot_name = $1`, slot).Scan(&at)
			if err != nil {
				t.Fatal(err)
			}
			return at.After(after)
		})
		return at
	}
	// The second update is taken after the first one's position is.
	replyAfter(replyAfter(now))
}

// TestStagesAddUp: no published message's stage is negative, and the
// stages add up to the commit-to-confirmation times reported beside them.
func TestStagesAddUp(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	var (
		mu      sync.Mutex
		totals  []time.Duration
		reports []logrelay.Stages
	)
	cfg := fastConfig(t)
	cfg.Observer.CommitToPublish = func(d time.Duration) { mu.Lock(); totals = append(totals, d); mu.Unlock() }
	cfg.Observer.Stages = func(s logrelay.Stages) { mu.Lock(); reports = append(reports, s); mu.Unlock() }
	start(t, pg, pub, cfg)
	const n = 20
	for i := range n {
		pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			VALUES ($1, 'order', $2, 'order.order.placed.v1', '{}')`, uuid.New(), fmt.Sprint(i%3))
	}
	waitLen(t, pub, n, 20*time.Second)
	eventually(t, 10*time.Second, "a report per message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(reports) == n && len(totals) == n
	})
	mu.Lock()
	defer mu.Unlock()
	for i, s := range reports {
		// The two hooks are called one after the other for each message,
		// under no common lock: compare the sums, not message by message.
		if s.Receive <= 0 || s.Visible < 0 || s.Queue < 0 || s.Confirm < 0 {
			t.Errorf("message %d: stages %+v, want receive positive, none negative", i, s)
		}
	}
	var sum, total time.Duration
	for i := range n {
		s := reports[i]
		sum += s.Receive + s.Visible + s.Queue + s.Confirm
		total += totals[i]
	}
	// The commit time is the server's wall clock, the others carry Go's
	// monotonic reading too: the sums may differ by nanoseconds.
	if d := (sum - total).Abs(); d > n*time.Microsecond {
		t.Errorf("stages add up to %v over %d messages, commit-to-publish to %v", sum, n, total)
	}
}
