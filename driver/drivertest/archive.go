package drivertest

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testsvc"
)

// Archive checks driver.OutboxArchiver, on the dialects that have it (those
// of the databases a CDC relay serves; SQLite has none): what ArchiveInfo
// tells of a missing, an empty and a filled archive, the filters, order and
// pages of ArchiveRows and ArchiveCounts, the events left to the outbox's
// replay, PurgeArchive's batches, and that another outbox's events in the
// same table are none of these.
func Archive[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	a, ok := db.Driver.Dialect().(driver.OutboxArchiver)
	if !ok {
		t.Skipf("the %s dialect has no archive: no CDC relay serves its databases", db.Driver.Dialect().Name())
	}
	ctx := testsvc.Ctx(t, 30*time.Second)
	pool := db.Driver.Pool()
	tables := db.Driver.Dialect().Tables()
	table := tables.OutboxArchive

	info, err := a.ArchiveInfo(ctx, pool)
	fatalIf(t, err, "archive info")
	if !info.Exists || !info.Empty {
		t.Errorf("ArchiveInfo of an empty archive = %+v", info)
	}

	// Events of aggregates a and b, one a minute, archived (published) an
	// hour apart from now back; c is also a published row of the outbox.
	base := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	now := time.Now().UTC().Truncate(time.Millisecond)
	type archived struct {
		ev        idem.Event
		published time.Time
	}
	var all []archived
	for i, agg := range []string{"a", "b", "a", "a", "b", "c"} {
		ev := changed(t, agg, i+1)
		ev.OccurredAt = base.Add(time.Duration(i) * time.Minute)
		ev.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		all = append(all, archived{ev, now.Add(time.Duration(i-6) * time.Hour)})
	}
	for _, r := range all {
		db.exec(t, `INSERT INTO `+table+` (outbox_table, id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers, published_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, tables.Outbox, r.ev.ID.String(), r.ev.AggregateType, r.ev.AggregateID, r.ev.Name, string(r.ev.Payload),
			db.timeArg(r.ev.OccurredAt), r.ev.AggregateVersion, `{"traceparent": "`+r.ev.Headers["traceparent"]+`"}`, db.timeArg(r.published))
	}
	// An event of another outbox of the schema, published first: not this
	// outbox's.
	other := changed(t, "a", 0)
	db.exec(t, `INSERT INTO `+table+` (outbox_table, id, aggregatetype, aggregateid, type, payload, occurred_at, published_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, "other_outbox", other.ID.String(), other.AggregateType, other.AggregateID, other.Name, "{}",
		db.timeArg(base.Add(-time.Hour)), db.timeArg(now.Add(-8*time.Hour)))
	c := all[5].ev
	insert(t, db, c)
	owner := uuid.New()
	rows := claim(t, db, db.Driver.Dialect(), owner, time.Minute, 10, 10)
	if n, err := db.Driver.Dialect().MarkPublished(ctx, pool, owner, claimedSeqs(rows)); err != nil || n != 1 {
		t.Fatalf("mark c published = %d, %v", n, err)
	}

	info, err = a.ArchiveInfo(ctx, pool)
	fatalIf(t, err, "archive info")
	if !info.Exists || info.Empty || !info.OldestOccurred.Equal(base) || !info.OldestPublished.Equal(all[0].published) || !info.NewestPublished.Equal(all[5].published) {
		t.Errorf("ArchiveInfo = %+v, want the oldest occurred at %v, published from %v to %v", info, base, all[0].published, all[5].published)
	}

	// c is left to the outbox's replay.
	counts, err := a.ArchiveCounts(ctx, pool, driver.ReplayFilter{})
	fatalIf(t, err, "archive counts")
	if counts["order.order.changed.v1"] != 5 || len(counts) != 1 {
		t.Errorf("ArchiveCounts = %v, want 5 (c is a published row of the outbox)", counts)
	}
	f := driver.ReplayFilter{Since: base.Add(time.Minute), Until: base.Add(4 * time.Minute), AggregateType: "order", EventName: "order.order.changed.v1"}
	if counts, err = a.ArchiveCounts(ctx, pool, f); err != nil || counts["order.order.changed.v1"] != 3 {
		t.Errorf("ArchiveCounts of minutes 1 to 3 = %v, %v; want 3", counts, err)
	}
	if counts, err = a.ArchiveCounts(ctx, pool, driver.ReplayFilter{EventName: "other"}); err != nil || len(counts) != 0 {
		t.Errorf("ArchiveCounts of another event name = %v, %v; want none", counts, err)
	}
	page, err := a.ArchiveRows(ctx, pool, driver.ReplayFilter{}, 0, 3)
	fatalIf(t, err, "archive rows")
	rest, err := a.ArchiveRows(ctx, pool, driver.ReplayFilter{}, page[len(page)-1].Seq, 10)
	fatalIf(t, err, "archive rows, second page")
	got := append(page, rest...)
	if len(page) != 3 || len(got) != 5 {
		t.Fatalf("ArchiveRows pages = %d + %d rows, want 3 + 2", len(page), len(rest))
	}
	for i, rec := range got {
		want := all[i]
		if rec.Unreadable != nil || rec.ID != want.ev.ID || rec.RawID != want.ev.ID.String() || rec.AggregateID != want.ev.AggregateID ||
			rec.Type != want.ev.Name || rec.AggregateVersion != want.ev.AggregateVersion || !rec.OccurredAt.Equal(want.ev.OccurredAt) ||
			!rec.CreatedAt.Equal(want.published) || rec.Headers["traceparent"] != want.ev.Headers["traceparent"] || rec.Attempts != 0 {
			t.Errorf("ArchiveRows[%d] = %+v, want %s of %s v%d, occurred at %v, published at %v", i, rec, want.ev.ID, want.ev.AggregateID,
				want.ev.AggregateVersion, want.ev.OccurredAt, want.published)
		}
		if i > 0 && rec.Seq <= got[i-1].Seq {
			t.Errorf("ArchiveRows not in seq order: %d after %d", rec.Seq, got[i-1].Seq)
		}
	}
	if rows, err := a.ArchiveRows(ctx, pool, f, 0, 10); err != nil || len(rows) != 3 || rows[0].ID != all[1].ev.ID {
		t.Errorf("ArchiveRows of minutes 1 to 3 = %d rows, %v; want 3 from %s", len(rows), err, all[1].ev.ID)
	}

	// Purge: nothing published before 7 hours ago; then the two published
	// before 4.5 hours ago (6 and 5 hours ago), in batches of 1, the oldest
	// first.
	if n, err := a.PurgeArchive(ctx, pool, now.Add(-7*time.Hour), 10); err != nil || n != 0 {
		t.Errorf("PurgeArchive before 7 hours ago = %d, %v; want 0 (the other outbox's event is not this one's)", n, err)
	}
	for i := range 3 {
		n, err := a.PurgeArchive(ctx, pool, now.Add(-270*time.Minute), 1)
		fatalIf(t, err, "purge archive")
		if want := int64(min(1, 2-i)); n != want {
			t.Errorf("PurgeArchive batch %d = %d, want %d", i, n, want)
		}
	}
	info, err = a.ArchiveInfo(ctx, pool)
	fatalIf(t, err, "archive info")
	if !info.OldestOccurred.Equal(all[2].ev.OccurredAt) || !info.OldestPublished.Equal(all[2].published) {
		t.Errorf("after the purge, ArchiveInfo = %+v; want the oldest %v, published %v", info, all[2].ev.OccurredAt, all[2].published)
	}

	if n := db.count(t, table+` WHERE outbox_table = ?`, "other_outbox"); n != 1 {
		t.Errorf("the other outbox's event purged")
	}
	db.exec(t, `DROP TABLE `+table)
	info, err = a.ArchiveInfo(ctx, pool)
	if err != nil || info.Exists {
		t.Errorf("ArchiveInfo without the table = %+v, %v; want it missing, no error", info, err)
	}
}
