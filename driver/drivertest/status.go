package drivertest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testsvc"
)

// Status checks the dialect's driver.StatusReader, what "idem status" and
// the dashboard read: the outbox's backlog, quarantined rows, oldest
// unpublished row and last publish; every consumer found in
// processed_event, failed_message or delivery_attempt, plus those asked
// for, sorted by name, with its last processed time, its markers of the
// window, its parked messages and their oldest first failure, and its
// events waiting for a retry; the database's clock; a database without
// tables (idem.ErrMissingTable) and one without an outbox (not an error).
func Status[TTx any](t *testing.T, setup Setup[TTx]) {
	t.Run("MissingTable", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{NoMigrate: true})
		_, err := db.Driver.Dialect().ReadStatus(testsvc.Ctx(t, time.Minute), db.Driver.Pool(), driver.StatusParams{})
		if !errors.Is(err, idem.ErrMissingTable) {
			t.Fatalf("status without migrations: %v, want ErrMissingTable", err)
		}
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		before := time.Now()
		st, err := db.Driver.Dialect().ReadStatus(testsvc.Ctx(t, time.Minute), db.Driver.Pool(), driver.StatusParams{})
		fatalIf(t, err, "status")
		if !st.Outbox.Present || st.Outbox != (driver.OutboxStatus{Present: true}) {
			t.Errorf("outbox of an empty database: %+v, want present and zero", st.Outbox)
		}
		if len(st.Consumers) != 0 {
			t.Errorf("consumers of an empty database: %+v", st.Consumers)
		}
		// The database's clock, on the same machine as the test.
		if d := st.Now.Sub(before); d < -5*time.Second || d > 5*time.Second {
			t.Errorf("Now %v, the test's clock %v", st.Now, before)
		}
	})

	t.Run("ConsumerOnly", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		ctx := testsvc.Ctx(t, time.Minute)
		d := db.Driver.Dialect()
		_, err := d.MarkProcessed(ctx, db.Driver.Pool(), "stock", []driver.Mark{{ID: uuid.Must(uuid.NewV7())}})
		fatalIf(t, err, "mark")
		db.exec(t, "DROP TABLE outbox")
		st, err := db.Driver.Dialect().ReadStatus(ctx, db.Driver.Pool(), driver.StatusParams{})
		fatalIf(t, err, "status of a database without outbox")
		if st.Outbox.Present {
			t.Errorf("outbox present after DROP TABLE: %+v", st.Outbox)
		}
		if len(st.Consumers) != 1 || st.Consumers[0].Name != "stock" || st.Consumers[0].Processed != 1 {
			t.Errorf("consumers: %+v, want stock with 1 processed", st.Consumers)
		}
	})

	t.Run("Figures", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		ctx := testsvc.Ctx(t, time.Minute)
		d := db.Driver.Dialect()
		pool := db.Driver.Pool()
		now := time.Now().UTC().Truncate(time.Millisecond)
		at := func(ago time.Duration) time.Time { return now.Add(-ago) }

		// The outbox: one row published, one quarantined, two pending.
		rows := make([]driver.OutboxRow, 4)
		for i := range rows {
			ev := placed(t, "o-"+string(rune('a'+i)))
			rows[i] = driver.OutboxRow{ID: ev.ID, AggregateType: ev.AggregateType, AggregateID: ev.AggregateID,
				Type: ev.Name, Payload: ev.Payload, OccurredAt: ev.OccurredAt}
		}
		fatalIf(t, d.InsertOutbox(ctx, pool, rows), "insert outbox")
		id := func(i int) string { return rows[i].ID.String() }
		db.exec(t, "UPDATE outbox SET published_at = ?, created_at = ? WHERE id = ?", db.timeArg(at(30*time.Second)), db.timeArg(at(3*time.Hour)), id(0))
		db.exec(t, "UPDATE outbox SET quarantined_at = ?, created_at = ? WHERE id = ?", db.timeArg(at(time.Hour)), db.timeArg(at(2*time.Hour)), id(1))
		db.exec(t, "UPDATE outbox SET created_at = ? WHERE id = ?", db.timeArg(at(90*time.Minute)), id(2))
		db.exec(t, "UPDATE outbox SET created_at = ? WHERE id = ?", db.timeArg(at(time.Minute)), id(3))

		// stock: three markers, two of them in the last minute.
		ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
		_, err := d.MarkProcessed(ctx, pool, "stock", []driver.Mark{{ID: ids[0]}, {ID: ids[1]}, {ID: ids[2]}})
		fatalIf(t, err, "mark")
		for i, ago := range []time.Duration{2 * time.Hour, 20 * time.Second, 5 * time.Second} {
			db.exec(t, "UPDATE processed_event SET processed_at = ? WHERE consumer_name = ? AND event_id = ?", db.timeArg(at(ago)), "stock", ids[i].String())
		}
		// Another consumer's markers do not count for stock.
		_, err = d.MarkProcessed(ctx, pool, "shipping", []driver.Mark{{ID: ids[0]}})
		fatalIf(t, err, "mark")
		db.exec(t, "UPDATE processed_event SET processed_at = ? WHERE consumer_name = ?", db.timeArg(at(10*time.Minute)), "shipping")
		// shipping: one event waiting for a retry.
		_, err = d.RecordAttempt(ctx, pool, "shipping", uuid.Must(uuid.NewV7()), "carrier down")
		fatalIf(t, err, "record attempt")
		// billing: two parked messages, known only to the failure store.
		for i, ago := range []time.Duration{45 * time.Minute, 5 * time.Minute} {
			fid, err := d.SaveFailed(ctx, pool, idem.FailedMessage{Consumer: "billing", EventID: uuid.Must(uuid.NewV7()),
				Body: []byte("not json"), Error: "undecodable", Attempts: i + 1})
			fatalIf(t, err, "save failed")
			db.exec(t, "UPDATE failed_message SET first_failed_at = ? WHERE id = ?", db.timeArg(at(ago)), fid)
		}

		st, err := db.Driver.Dialect().ReadStatus(ctx, pool, driver.StatusParams{Consumers: []string{"audit", "stock"}, Window: time.Minute})
		fatalIf(t, err, "status")

		o := st.Outbox
		if !o.Present || o.Backlog != 2 || o.Quarantined != 1 {
			t.Errorf("outbox: %+v, want present, backlog 2, quarantined 1", o)
		}
		sameTime(t, "outbox oldest unpublished", o.OldestUnpublished, at(90*time.Minute))
		sameTime(t, "outbox last published", o.LastPublished, at(30*time.Second))

		want := []driver.ConsumerStatus{
			{Name: "audit"},
			{Name: "billing", Parked: 2, OldestParked: at(45 * time.Minute)},
			{Name: "shipping", LastProcessed: at(10 * time.Minute), Retrying: 1},
			{Name: "stock", LastProcessed: at(5 * time.Second), Processed: 2},
		}
		if len(st.Consumers) != len(want) {
			t.Fatalf("consumers: %+v, want %d: audit, billing, shipping, stock", st.Consumers, len(want))
		}
		for i, w := range want {
			g := st.Consumers[i]
			if g.Name != w.Name || g.Processed != w.Processed || g.Parked != w.Parked || g.Retrying != w.Retrying {
				t.Errorf("consumer %d: %+v, want %+v", i, g, w)
			}
			sameTime(t, w.Name+" last processed", g.LastProcessed, w.LastProcessed)
			sameTime(t, w.Name+" oldest parked", g.OldestParked, w.OldestParked)
		}

		// A window of three hours takes the old marker in.
		st, err = db.Driver.Dialect().ReadStatus(ctx, pool, driver.StatusParams{Window: 3 * time.Hour})
		fatalIf(t, err, "status")
		if c := st.Consumers[len(st.Consumers)-1]; c.Name != "stock" || c.Processed != 3 {
			t.Errorf("stock over 3 hours: %+v, want 3 processed", c)
		}
	})
}

// sameTime fails t unless got and want are the same instant to the
// millisecond, or both zero.
func sameTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if got.IsZero() != want.IsZero() {
		t.Errorf("%s: %v, want %v", what, got, want)
		return
	}
	if d := got.Sub(want); d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("%s: %v, want %v", what, got, want)
	}
}
