package cdc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/logrelay"
)

// archiveBase is when the archive tests' events occurred: one a minute from
// then on.
var archiveBase = time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)

// writeTimed writes n events over aggs aggregates, the i-th occurred i
// minutes after archiveBase, in transactions of 6: as table rows, as WAL
// messages, or each transaction one or the other in turn ("mixed").
func writeTimed(t *testing.T, pg *testdb.PG, mode string, n, aggs int) []idem.Event {
	t.Helper()
	rows := outbox.NewWriter(pg.Driver)
	wal, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	var evs []idem.Event
	for i := range n {
		ev := event(t, fmt.Sprint(i%aggs), i/aggs+1)
		ev.OccurredAt = archiveBase.Add(time.Duration(i) * time.Minute)
		evs = append(evs, ev)
	}
	ctx := context.Background()
	for i := 0; i < n; i += 6 {
		w := rows
		if mode == "wal" || (mode == "mixed" && i/6%2 == 1) {
			w = wal
		}
		if err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error { return w.Add(ctx, tx, evs[i:min(i+6, n)]...) }); err != nil {
			t.Fatal(err)
		}
	}
	return evs
}

// checkReplayed checks that msgs hold each event of want once, nothing
// else, and each aggregate's in the order of its versions.
func checkReplayed(t *testing.T, msgs []idem.Message, want []idem.Event) {
	t.Helper()
	wanted := map[uuid.UUID]bool{}
	for _, ev := range want {
		wanted[ev.ID] = true
	}
	got := map[uuid.UUID]int{}
	last := map[string]int64{}
	for _, m := range msgs {
		got[m.EventID]++
		if !wanted[m.EventID] {
			t.Errorf("event %s replayed, not in the period", m.EventID)
		}
		ev := decode(t, m)
		if ev.AggregateVersion <= last[ev.AggregateID] {
			t.Errorf("aggregate %s: version %d replayed after %d", ev.AggregateID, ev.AggregateVersion, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.AggregateVersion
	}
	for _, ev := range want {
		if got[ev.ID] != 1 {
			t.Errorf("event %s (aggregate %s v%d) replayed %d times, want 1", ev.ID, ev.AggregateID, ev.AggregateVersion, got[ev.ID])
		}
	}
}

// inPeriod returns the events of evs that occurred in [since, until).
func inPeriod(evs []idem.Event, since, until time.Time) []idem.Event {
	var out []idem.Event
	for _, ev := range evs {
		if !ev.OccurredAt.Before(since) && ev.OccurredAt.Before(until) {
			out = append(out, ev)
		}
	}
	return out
}

// TestArchiveReplay: with the archive on (the default), the events the
// relay published, table rows and WAL messages alike, are archived once
// each, the rows deleted from the outbox (or kept, with KeepRows), and relay.Replay of a period
// publishes exactly that period's events again, each aggregate's in order.
func TestArchiveReplay(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"rows", "wal", "mixed", "rows-kept"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pg := newDB(t)
			pub := memory.New()
			cfg := fastConfig(t)
			kept := 0
			if mode == "rows-kept" {
				// The rows stay, unmarked: the archive holds them too.
				cfg.Delete, mode, kept = logrelay.KeepRows, "rows", 120
			}
			r := start(t, pg, pub, cfg)
			evs := writeTimed(t, pg, mode, 120, 7)
			waitLen(t, pub, len(evs), 30*time.Second)
			eventually(t, 10*time.Second, "every event archived", func() bool { return r.Stats().Archived == int64(len(evs)) })
			if n := pg.Count(t, "outbox"); n != kept {
				t.Errorf("%d rows left in the outbox, want %d", n, kept)
			}
			if n := pg.Count(t, "outbox_archive"); n != len(evs) {
				t.Errorf("the archive holds %d events, want %d", n, len(evs))
			}

			ctx := context.Background()
			f := relay.ReplayFilter{Since: archiveBase.Add(25 * time.Minute), Until: archiveBase.Add(85 * time.Minute)}
			want := inPeriod(evs, f.Since, f.Until)
			counts, err := relay.ReplayCounts(ctx, pg.Driver, f)
			if err != nil {
				t.Fatal(err)
			}
			if counts["order.order.changed.v1"] != int64(len(want)) || len(counts) != 1 {
				t.Errorf("ReplayCounts = %v, want %d order.order.changed.v1", counts, len(want))
			}
			replayed := memory.New()
			n, err := relay.Replay(ctx, pg.Driver, replayed, f, relay.ReplayOptions{BatchSize: 7})
			if err != nil || n != int64(len(want)) {
				t.Fatalf("Replay = %d, %v; want %d", n, err, len(want))
			}
			checkReplayed(t, replayed.Messages(), want)
			// The replayed messages are the published ones.
			published := map[uuid.UUID]string{}
			for _, m := range pub.Messages() {
				published[m.EventID] = string(m.Body)
			}
			for _, m := range replayed.Messages() {
				if published[m.EventID] != string(m.Body) {
					t.Errorf("event %s replayed as %s, published as %s", m.EventID, m.Body, published[m.EventID])
				}
			}
		})
	}
}

// TestArchiveRetention: the relay deletes the events archived longer ago
// than its ArchiveRetention, and those only; a replay of their period
// finds nothing, and relay.Archive tells from when the archive holds
// events.
func TestArchiveRetention(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	cfg := fastConfig(t)
	cfg.ArchiveRetention = time.Hour
	cfg.ArchivePurgeInterval = 20 * time.Millisecond
	r := start(t, pg, pub, cfg)
	evs := writeTimed(t, pg, "mixed", 60, 5)
	eventually(t, 30*time.Second, "every event archived", func() bool { return r.Stats().Archived == int64(len(evs)) })

	// The first 20 minutes' events as if archived two hours ago.
	cut := archiveBase.Add(20 * time.Minute)
	if _, err := pg.Pool.Exec(context.Background(), `UPDATE outbox_archive SET published_at = now() - interval '2 hours' WHERE occurred_at < $1`, cut); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the old events purged", func() bool {
		return pg.Count(t, "outbox_archive WHERE occurred_at < $1", cut) == 0
	})
	if n := pg.Count(t, "outbox_archive"); n != 40 {
		t.Errorf("the archive holds %d events after the purge, want the 40 within the retention", n)
	}
	if s := r.Stats(); s.ArchivePurged != 20 {
		t.Errorf("Stats().ArchivePurged = %d, want 20", s.ArchivePurged)
	}

	ctx := context.Background()
	old := relay.ReplayFilter{Since: archiveBase, Until: cut}
	if n, err := relay.Replay(ctx, pg.Driver, memory.New(), old, relay.ReplayOptions{}); err != nil || n != 0 {
		t.Errorf("Replay of the purged period = %d, %v; want 0", n, err)
	}
	info, ok, err := relay.Archive(ctx, pg.Driver)
	if err != nil || !ok || !info.Exists || info.Empty {
		t.Fatalf("Archive = %+v, %v, %v", info, ok, err)
	}
	if !info.OldestOccurred.Equal(cut) {
		t.Errorf("the archive's oldest event occurred at %v, want %v", info.OldestOccurred, cut)
	}
	replayed := memory.New()
	all := relay.ReplayFilter{Since: archiveBase, Until: archiveBase.Add(time.Hour)}
	if n, err := relay.Replay(ctx, pg.Driver, replayed, all, relay.ReplayOptions{}); err != nil || n != 40 {
		t.Errorf("Replay of the whole hour = %d, %v; want the 40 kept", n, err)
	}
	checkReplayed(t, replayed.Messages(), inPeriod(evs, cut, all.Until))
}

// TestArchiveOff: with a negative ArchiveRetention nothing is archived;
// without the archive's table, the relay refuses to start unless the
// archive is off.
func TestArchiveOff(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	cfg := fastConfig(t)
	cfg.ArchiveRetention = -1
	r := start(t, pg, pub, cfg)
	evs := writeTimed(t, pg, "mixed", 12, 3)
	waitLen(t, pub, len(evs), 30*time.Second)
	eventually(t, 10*time.Second, "the rows deleted", func() bool { return pg.Count(t, "outbox") == 0 })
	stop(t, r)
	if n := pg.Count(t, "outbox_archive"); n != 0 || r.Stats().Archived != 0 {
		t.Errorf("the archive holds %d events (Stats().Archived %d) with the archive off", n, r.Stats().Archived)
	}

	if _, err := pg.Pool.Exec(context.Background(), `DROP TABLE outbox_archive`); err != nil {
		t.Fatal(err)
	}
	onCfg := fastConfig(t)
	onCfg.Tables.Schema, onCfg.MessagePrefix = pg.Schema, pg.Schema
	on, err := cdc.New(pg.URL, memory.New(), onCfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = on.Start(ctx)
	if err == nil {
		stop(t, on)
		t.Fatal("Start without the archive's table succeeded")
	}
	for _, want := range []string{"outbox_archive", "idem migrate", "--archive-retention 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start's error %q does not say %q", err, want)
		}
	}
	info, ok, err := relay.Archive(ctx, pg.Driver)
	if err != nil || !ok || info.Exists {
		t.Errorf("Archive without its table = %+v, %v, %v; want it missing", info, ok, err)
	}
	start(t, pg, pub, cfg) // off: starts
}

// TestArchiveRefusedValue: a published event whose values the archive
// cannot hold (a WAL message's aggregate id with a NUL character, which
// PostgreSQL's text refuses) is left out of it, and the others of its batch
// archived: the slot's position goes on. JSON that jsonb would refuse
// (\u0000 in a string) is archived as it was published.
func TestArchiveRefusedValue(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pub := memory.New()
	r := start(t, pg, pub, fastConfig(t))
	ctx := context.Background()
	nul, escaped, plain := uuid.New(), uuid.New(), uuid.New()
	msg := func(id uuid.UUID, agg, payload string) string {
		return fmt.Sprintf(`SELECT pg_logical_emit_message(true, '%s', '{"id": "%s", "aggregatetype": "order", "aggregateid": "%s", "type": "order.order.changed.v1", "payload": %s}')`,
			pg.Schema, id, agg, payload)
	}
	err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
		for _, q := range []string{msg(nul, `a\u0000b`, `{}`), msg(escaped, "b", `{"note": "x\u0000y"}`), msg(plain, "c", `{}`)} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	waitLen(t, pub, 3, 30*time.Second)
	eventually(t, 10*time.Second, "the archivable events archived", func() bool { return r.Stats().Archived == 2 })
	if n := pg.Count(t, "outbox_archive WHERE id = ANY($1)", []string{escaped.String(), plain.String()}); n != 2 {
		t.Errorf("the archive holds %d of the two archivable events", n)
	}
	var payload string
	if err := pg.Pool.QueryRow(ctx, `SELECT payload::text FROM outbox_archive WHERE id = $1`, escaped.String()).Scan(&payload); err != nil || payload != `{"note": "x\u0000y"}` {
		t.Errorf("archived payload = %q, %v", payload, err)
	}
	// The position went on: a later event is archived too.
	later := writeTimed(t, pg, "rows", 1, 1)
	eventually(t, 10*time.Second, "a later event archived", func() bool {
		return pg.Count(t, "outbox_archive WHERE id = $1", later[0].ID.String()) == 1
	})
}

// TestArchiveInitialRows: the rows waiting in the outbox when the slot is
// created, which the relay publishes before the stream and deletes by seq,
// are archived in the statement that deletes them.
func TestArchiveInitialRows(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	evs := writeTimed(t, pg, "rows", 30, 4)
	pub := memory.New()
	r := start(t, pg, pub, fastConfig(t))
	waitLen(t, pub, len(evs), 30*time.Second)
	eventually(t, 10*time.Second, "the waiting rows archived and deleted", func() bool {
		return r.Stats().Archived == int64(len(evs)) && pg.Count(t, "outbox") == 0
	})
	replayed := memory.New()
	n, err := relay.Replay(context.Background(), pg.Driver, replayed, relay.ReplayFilter{Since: archiveBase}, relay.ReplayOptions{})
	if err != nil || n != int64(len(evs)) {
		t.Fatalf("Replay = %d, %v; want %d", n, err, len(evs))
	}
	checkReplayed(t, replayed.Messages(), evs)
}

// TestArchiveBesideReading: the deletes and the archive are written beside
// the reading: while they wait (the archive locked by another session),
// the relay goes on reading the log and publishing, and no position past
// the rows not yet deleted is confirmed; once the lock goes, every row is
// deleted and every event archived once.
func TestArchiveBesideReading(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	cfg := fastConfig(t)
	cfg.QueryTimeout = 2 * time.Minute // the wait below is on the lock, not on a timeout
	pub := memory.New()
	r := start(t, pg, pub, cfg)
	eventually(t, 30*time.Second, "the relay streaming", func() bool { return r.Stats().Streaming })
	first := writeTimed(t, pg, "table", 6, 3)
	ctx := testsvc.Ctx(t, 2*time.Minute)
	if err := pub.WaitLen(ctx, 6); err != nil {
		t.Fatal(err)
	}
	lock, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.Background()) }()
	if _, err := lock.Exec(ctx, `LOCK TABLE outbox_archive IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	second := writeTimed(t, pg, "table", 6, 3)
	testsvc.WaitFor(t, time.Minute, "the relay's archive write waiting on the lock", func() bool {
		var n int
		err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query ILIKE '%outbox_archive%' AND pid <> pg_backend_pid()`).Scan(&n)
		return err == nil && n > 0
	})
	// The reading goes on: events written now reach the broker while the
	// write waits. Read in the same flush as the waiting write, they
	// would wait for the lock.
	third := writeTimed(t, pg, "wal", 6, 3)
	if err := pub.WaitLen(ctx, 18); err != nil {
		t.Fatalf("events written while the archive waited: %v (stats %+v)", err, r.Stats())
	}
	if n := pg.Count(t, "outbox_archive"); n == 18 {
		t.Fatal("the archive was written through the lock")
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, time.Minute, "every event archived, every row deleted", func() bool {
		return pg.Count(t, "outbox_archive") == 18 && pg.Count(t, "outbox") == 0
	})
	stop(t, r)
	got := map[uuid.UUID]int{}
	for _, m := range pub.Messages() {
		got[m.EventID]++
	}
	for _, ev := range append(append(first, second...), third...) {
		if got[ev.ID] != 1 {
			t.Errorf("event %s published %d times, want 1", ev.ID, got[ev.ID])
		}
	}
}
