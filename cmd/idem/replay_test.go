package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
)

// TestReplayUnderCDC: "idem cdc" (a child process, the archive on by
// default) publishes table rows and WAL messages; "idem replay" of a period
// then publishes exactly that period's events again, each aggregate's in
// order. A period older than the archive's oldest event says so, and
// without the archive's table the command says what the relays keep and
// how to keep more.
func TestReplayUnderCDC(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	dropSlotAtCleanup(t, pg)
	h := newHook(t)
	p := startCDC(t, "cdc", pg, h.url(), "")
	p.waitStreaming(t)

	base := time.Now().UTC().Add(-3 * time.Hour).Truncate(time.Minute)
	var evs []idemmsg.Event
	for i := range 90 {
		ev, err := idemmsg.NewEvent("order.order.changed.v1", "order", fmt.Sprint(i%7), map[string]any{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		ev.AggregateVersion = int64(i/7 + 1)
		ev.OccurredAt = base.Add(time.Duration(i) * time.Minute)
		evs = append(evs, ev)
	}
	rows := outbox.NewWriter(pg.Driver)
	wal, err := outbox.NewLogWriter(pg.Driver, cdcPrefix(pg))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < len(evs); i += 5 {
		w := rows
		if i/5%2 == 1 {
			w = wal
		}
		if err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error { return w.Add(ctx, tx, evs[i:i+5]...) }); err != nil {
			t.Fatal(err)
		}
	}
	testsvc.WaitFor(t, 30*time.Second, "every event archived", func() bool { return pg.Count(t, "outbox_archive") == len(evs) })
	p.stop(t)
	if n := len(h.ids()); n != len(evs) {
		t.Fatalf("idem cdc published %d events, want %d", n, len(evs))
	}

	since, until := base.Add(20*time.Minute), base.Add(65*time.Minute)
	replayed := newHook(t)
	env := map[string]string{"IDEM_DB_URL": pg.URL, "IDEM_BROKER_URL": replayed.url()}
	code, out, errOut := idem(t, env, "", "replay", "--since", since.Format(time.RFC3339), "--until", until.Format(time.RFC3339), "--yes", "--batch-size", "8")
	if code != 0 || !strings.Contains(out, "order.order.changed.v1 45") || !strings.Contains(out, "Replayed 45 events") {
		t.Fatalf("replay = %d:\n%s%s", code, out, errOut)
	}
	if strings.Contains(out, "archive's oldest") {
		t.Errorf("a period within the archive got a note on its retention:\n%s", out)
	}
	got := map[uuid.UUID]int{}
	last := map[string]int64{}
	for _, m := range replayed.messages() {
		got[m.EventID]++
		ev, err := idemmsg.Decode(idemmsg.Message{EventID: m.EventID, EventName: m.EventName, AggregateType: m.AggregateType, Key: m.Key, Headers: m.Headers, Body: m.Body})
		if err != nil {
			t.Fatal(err)
		}
		if ev.AggregateVersion <= last[ev.AggregateID] {
			t.Errorf("aggregate %s: version %d replayed after %d", ev.AggregateID, ev.AggregateVersion, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.AggregateVersion
	}
	for _, ev := range evs {
		want := 0
		if !ev.OccurredAt.Before(since) && ev.OccurredAt.Before(until) {
			want = 1
		}
		if got[ev.ID] != want {
			t.Errorf("event at %s replayed %d times, want %d", ev.OccurredAt.Format(time.TimeOnly), got[ev.ID], want)
		}
	}

	// Before the archive's oldest event: nothing, and why.
	code, out, errOut = idem(t, env, "", "replay", "--since", base.Add(-2*time.Hour).Format(time.RFC3339), "--until", base.Format(time.RFC3339))
	if code != 0 || !strings.Contains(out, "none. Nothing to replay.") || !strings.Contains(out, "archive's oldest event (occurred at "+base.Format(time.RFC3339)) ||
		!strings.Contains(out, "beyond its --archive-retention") {
		t.Errorf("replay before the archive = %d:\n%s%s", code, out, errOut)
	}
	t.Logf("idem replay before the archive:\n%s", out)
	// Partly before: what there is, and a note.
	code, out, errOut = idem(t, env, "", "replay", "--since", base.Add(-time.Hour).Format(time.RFC3339), "--until", base.Add(10*time.Minute).Format(time.RFC3339), "--yes")
	if code != 0 || !strings.Contains(out, "Replayed 10 events") || !strings.Contains(out, "archive's oldest event") {
		t.Errorf("replay partly before the archive = %d:\n%s%s", code, out, errOut)
	}

	// An empty archive: the relay runs without it, or published nothing.
	if _, err := pg.Pool.Exec(ctx, `DELETE FROM outbox_archive`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = idem(t, env, "", "replay", "--since", "6h")
	if code != 0 || !strings.Contains(out, "none. Nothing to replay.") || !strings.Contains(out, "is empty") ||
		!strings.Contains(out, "--archive-retention 0") {
		t.Errorf("replay with an empty archive = %d:\n%s%s", code, out, errOut)
	}
	t.Logf("idem replay with an empty archive:\n%s", out)
	// No archive at all.
	if _, err := pg.Pool.Exec(ctx, `DROP TABLE outbox_archive`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = idem(t, env, "", "replay", "--since", "6h")
	if code != 0 || !strings.Contains(out, "none. Nothing to replay.") || !strings.Contains(out, "no archive") ||
		!strings.Contains(out, "migration 0013") || !strings.Contains(out, "idem relay keeps published rows") {
		t.Errorf("replay without an archive = %d:\n%s%s", code, out, errOut)
	}
	t.Logf("idem replay without an archive:\n%s", out)
}

// TestReplayHelp: "idem help replay" says what each relay keeps.
func TestReplayHelp(t *testing.T) {
	t.Parallel()
	code, out, errOut := idem(t, nil, "", "help", "replay")
	if code != 0 {
		t.Fatalf("help replay = %d\n%s", code, errOut)
	}
	for _, want := range []string{"idem relay", "--retention", "idem cdc", "outbox_archive", "--archive-retention", "nothing it\n               published can be replayed"} {
		if !strings.Contains(out, want) {
			t.Errorf("idem help replay does not say %q:\n%s", want, out)
		}
	}
}

// TestArchiveRetentionFlag: --archive-retention takes a positive duration,
// in days too; any zero turns the archive off (a negative retention).
func TestArchiveRetentionFlag(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"168h": 168 * time.Hour, "7d": 7 * 24 * time.Hour, "90m": 90 * time.Minute,
		"0": -1, "0s": -1, "0h": -1, "0d": -1} {
		if got, err := archiveRetention(in); err != nil || got != want {
			t.Errorf("archiveRetention(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"-1h", "soon", ""} {
		if got, err := archiveRetention(in); err == nil {
			t.Errorf("archiveRetention(%q) = %v, want an error", in, got)
		}
	}
}
