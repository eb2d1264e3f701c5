package binlog_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/binlog"
)

// archiveBase is when the archive tests' events occurred: one a minute from
// then on.
var archiveBase = time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)

// writeTimed writes n events over aggs aggregates, the i-th occurred i
// minutes after archiveBase, in transactions of 6.
func writeTimed(t *testing.T, db *testdb.SQLDB, n, aggs int) []idem.Event {
	t.Helper()
	w := outbox.NewWriter(db.Driver)
	var evs []idem.Event
	for i := range n {
		ev, err := idem.NewEvent("order.changed.v1", "order", fmt.Sprint(i%aggs), map[string]any{"version": i/aggs + 1})
		if err != nil {
			t.Fatal(err)
		}
		ev.AggregateVersion = int64(i/aggs + 1)
		ev.OccurredAt = archiveBase.Add(time.Duration(i) * time.Minute)
		evs = append(evs, ev)
	}
	ctx := context.Background()
	for i := 0; i < n; i += 6 {
		tx, err := db.DB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Add(ctx, tx, evs[i:min(i+6, n)]...); err != nil {
			_ = tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
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
		ev, err := idem.Decode(m)
		if err != nil {
			t.Fatal(err)
		}
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
// binlog relay published are archived once each, in the transaction that
// deletes their rows, and relay.Replay of a period publishes exactly that
// period's events again, each aggregate's in order.
func TestArchiveReplay(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t)
	pub := memory.New()
	r := start(t, db, pub, fastConfig(t))
	evs := writeTimed(t, db, 120, 7)
	waitLen(t, pub, len(evs))
	eventually(t, "every event archived", func() bool { return r.Stats().Archived == int64(len(evs)) })
	if n := db.Count(t, "outbox"); n != 0 {
		t.Errorf("%d rows left in the outbox", n)
	}
	if n := db.Count(t, "outbox_archive"); n != len(evs) {
		t.Errorf("the archive holds %d events, want %d", n, len(evs))
	}

	ctx := context.Background()
	f := relay.ReplayFilter{Since: archiveBase.Add(25 * time.Minute), Until: archiveBase.Add(85 * time.Minute)}
	want := inPeriod(evs, f.Since, f.Until)
	counts, err := relay.ReplayCounts(ctx, db.Driver, f)
	if err != nil {
		t.Fatal(err)
	}
	if counts["order.changed.v1"] != int64(len(want)) || len(counts) != 1 {
		t.Errorf("ReplayCounts = %v, want %d order.changed.v1", counts, len(want))
	}
	replayed := memory.New()
	n, err := relay.Replay(ctx, db.Driver, replayed, f, relay.ReplayOptions{BatchSize: 7})
	if err != nil || n != int64(len(want)) {
		t.Fatalf("Replay = %d, %v; want %d", n, err, len(want))
	}
	checkReplayed(t, replayed.Messages(), want)
	published := map[uuid.UUID]string{}
	for _, m := range pub.Messages() {
		published[m.EventID] = string(m.Body)
	}
	for _, m := range replayed.Messages() {
		if published[m.EventID] != string(m.Body) {
			t.Errorf("event %s replayed as %s, published as %s", m.EventID, m.Body, published[m.EventID])
		}
	}
}

// TestArchiveRetention: the relay deletes the events archived longer ago
// than its ArchiveRetention, and those only; a replay of their period
// finds nothing, and relay.Archive tells from when the archive holds
// events.
func TestArchiveRetention(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t)
	cfg := fastConfig(t)
	cfg.ArchiveRetention = time.Hour
	cfg.ArchivePurgeInterval = 20 * time.Millisecond
	r := start(t, db, memory.New(), cfg)
	evs := writeTimed(t, db, 60, 5)
	eventually(t, "every event archived", func() bool { return r.Stats().Archived == int64(len(evs)) })

	cut := archiveBase.Add(20 * time.Minute)
	cutArg := cut.Format("2006-01-02 15:04:05")
	db.Exec(t, `UPDATE outbox_archive SET published_at = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR WHERE occurred_at < ?`, cutArg)
	eventually(t, "the old events purged", func() bool { return db.Count(t, "outbox_archive WHERE occurred_at < ?", cutArg) == 0 })
	if n := db.Count(t, "outbox_archive"); n != 40 {
		t.Errorf("the archive holds %d events after the purge, want the 40 within the retention", n)
	}
	if s := r.Stats(); s.ArchivePurged != 20 {
		t.Errorf("Stats().ArchivePurged = %d, want 20", s.ArchivePurged)
	}
	ctx := context.Background()
	if n, err := relay.Replay(ctx, db.Driver, memory.New(), relay.ReplayFilter{Since: archiveBase, Until: cut}, relay.ReplayOptions{}); err != nil || n != 0 {
		t.Errorf("Replay of the purged period = %d, %v; want 0", n, err)
	}
	info, ok, err := relay.Archive(ctx, db.Driver)
	if err != nil || !ok || !info.Exists || info.Empty || !info.OldestOccurred.Equal(cut) {
		t.Errorf("Archive = %+v, %v, %v; want its oldest event at %v", info, ok, err, cut)
	}
	replayed := memory.New()
	if n, err := relay.Replay(ctx, db.Driver, replayed, relay.ReplayFilter{Since: archiveBase}, relay.ReplayOptions{}); err != nil || n != 40 {
		t.Errorf("Replay since the start = %d, %v; want the 40 kept", n, err)
	}
	checkReplayed(t, replayed.Messages(), inPeriod(evs, cut, archiveBase.Add(time.Hour)))
}

// TestArchiveOff: with a negative ArchiveRetention nothing is archived;
// without the archive's table the relay refuses to start unless the
// archive is off.
func TestArchiveOff(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t)
	pub := memory.New()
	cfg := fastConfig(t)
	cfg.ArchiveRetention = -1
	r := start(t, db, pub, cfg)
	evs := writeTimed(t, db, 12, 3)
	waitLen(t, pub, len(evs))
	eventually(t, "the rows deleted", func() bool { return db.Count(t, "outbox") == 0 })
	stop(t, r)
	if n := db.Count(t, "outbox_archive"); n != 0 || r.Stats().Archived != 0 {
		t.Errorf("the archive holds %d events (Stats().Archived %d) with the archive off", n, r.Stats().Archived)
	}

	db.Exec(t, `DROP TABLE outbox_archive`)
	on, err := binlog.New(db.URL, memory.New(), fastConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err = on.Start(ctx); err == nil {
		stop(t, on)
		t.Fatal("Start without the archive's table succeeded")
	}
	for _, want := range []string{"outbox_archive", "idem migrate", "--archive-retention 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start's error %q does not say %q", err, want)
		}
	}
	info, ok, err := relay.Archive(ctx, db.Driver)
	if err != nil || !ok || info.Exists {
		t.Errorf("Archive without its table = %+v, %v, %v; want it missing", info, ok, err)
	}
}

// TestArchiveRefusedValue: a published event whose values the archive
// cannot hold (an aggregate id longer than its VARCHAR(255), from a foreign
// outbox with a wider column) is left out of it, the others of its batch
// archived, in the transaction that deletes their rows: the position goes
// on.
func TestArchiveRefusedValue(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t)
	db.Exec(t, `ALTER TABLE outbox DROP INDEX outbox_aggregate_pending_idx, MODIFY aggregateid VARCHAR(600) NOT NULL`)
	pub := memory.New()
	r := start(t, db, pub, fastConfig(t))
	long := strings.Repeat("x", 300)
	w := outbox.NewWriter(db.Driver)
	var evs []idem.Event
	for _, agg := range []string{"a", long, "b"} {
		ev, err := idem.NewEvent("order.changed.v1", "order", agg, map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	ctx := context.Background()
	tx, err := db.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(ctx, tx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	waitLen(t, pub, 3)
	eventually(t, "the archivable events archived and the rows deleted", func() bool {
		return r.Stats().Archived == 2 && db.Count(t, "outbox") == 0
	})
	if n := db.Count(t, "outbox_archive WHERE id IN (?, ?)", evs[0].ID.String(), evs[2].ID.String()); n != 2 {
		t.Errorf("the archive holds %d of the two archivable events", n)
	}
	later := writeTimed(t, db, 1, 1)
	eventually(t, "a later event archived", func() bool { return db.Count(t, "outbox_archive WHERE id = ?", later[0].ID.String()) == 1 })
}

// TestArchiveInitialRows: the rows waiting in the outbox at the relay's
// first start, published before the binlog, are archived with the others.
func TestArchiveInitialRows(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t)
	evs := writeTimed(t, db, 30, 4)
	pub := memory.New()
	r := start(t, db, pub, fastConfig(t))
	waitLen(t, pub, len(evs))
	eventually(t, "the waiting rows archived and deleted", func() bool {
		return r.Stats().Archived == int64(len(evs)) && db.Count(t, "outbox") == 0
	})
	replayed := memory.New()
	n, err := relay.Replay(context.Background(), db.Driver, replayed, relay.ReplayFilter{Since: archiveBase}, relay.ReplayOptions{})
	if err != nil || n != int64(len(evs)) {
		t.Fatalf("Replay = %d, %v; want %d", n, err, len(evs))
	}
	checkReplayed(t, replayed.Messages(), evs)
}
