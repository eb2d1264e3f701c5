package drivertest

import (
	"database/sql"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testsvc"
)

// CheckFeatures checks DB.Features, and what the suite learns from the
// driver, against the database, so that a setup that declares them wrong
// fails here rather than leaving other checks out:
//
//   - Placeholders and TimeArg: a marker written with a time (in a zone
//     other than UTC) reads back as that time, and PurgeProcessed compares
//     it as that time;
//   - UUIDColumns: an outbox id that is not a UUID is refused, or stored
//     (and with UUIDColumns, stored once DB.TextIDs ran);
//   - DynamicTyping: text in the outbox's timestamp, version and headers
//     columns is refused, or stored;
//   - SingleWriter: a transaction writing a row goes on while another holds
//     another row, or waits for it to end;
//   - MigrationSupport.TransactionalDDL: a table created in a transaction
//     rolled back is gone, or stays.
func CheckFeatures[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	f := db.Features
	pool := db.Driver.Pool()
	t.Logf("features: %+v; driver %T: listener %v, pipelined claims %v, transactional DDL %v", f, db.Driver,
		implements[driver.OutboxListener](db.Driver), implements[driver.OutboxClaimer](db.Driver),
		db.Driver.Dialect().MigrationSupport().TransactionalDDL)

	t.Run("PlaceholdersAndTimeArg", func(t *testing.T) {
		at := time.Date(2031, 5, 6, 7, 8, 9, 123456000, time.FixedZone("UTC+2", 2*3600))
		id := idem.NewEventID()
		db.exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at) VALUES (?, ?, ?)`, "probe", id.String(), db.timeArg(at))
		var got time.Time
		db.queryRow(t, `SELECT processed_at FROM processed_event WHERE consumer_name = ? AND event_id = ?`, []any{"probe", id.String()}, timeScanner{&got})
		if !got.Equal(at) {
			t.Errorf("a marker written at %v reads back as %v: check Features.TimeArg", at, got)
		}
		d := db.Driver.Dialect()
		if n, err := d.PurgeProcessed(ctx, pool, "probe", at, 10); err != nil || n != 0 {
			t.Errorf("purge before the marker's time deleted %d (%v), want 0: check Features.TimeArg", n, err)
		}
		if n, err := d.PurgeProcessed(ctx, pool, "probe", at.Add(time.Microsecond), 10); err != nil || n != 1 {
			t.Errorf("purge just after the marker's time deleted %d (%v), want 1: check Features.TimeArg", n, err)
		}
	})

	t.Run("UUIDColumns", func(t *testing.T) {
		_, err := pool.Exec(ctx, db.bind(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', 'probe', 'Probe', '{}')`), "E-probe")
		switch {
		case f.UUIDColumns && err == nil:
			t.Error("the outbox stored an id that is not a UUID: its id column is text, Features.UUIDColumns must be false")
		case !f.UUIDColumns && err != nil:
			t.Errorf("the outbox refused an id that is not a UUID (%v): set Features.UUIDColumns", err)
		}
		db.exec(t, `DELETE FROM outbox WHERE aggregateid = 'probe'`)
		if f.UUIDColumns {
			db.exec(t, db.TextIDs)
			db.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', 'probe', 'Probe', '{}')`, "E-probe")
			var id string
			db.queryRow(t, `SELECT id FROM outbox WHERE aggregateid = 'probe'`, nil, &id)
			if id != "E-probe" {
				t.Errorf("after DB.TextIDs, the outbox stored the id \"E-probe\" as %q", id)
			}
			db.exec(t, `DELETE FROM outbox WHERE aggregateid = 'probe'`)
		}
	})

	t.Run("DynamicTyping", func(t *testing.T) {
		_, err := pool.Exec(ctx, db.bind(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers)
VALUES (?, 'order', 'probe', 'Probe', '{}', 'yesterday', 'v1', 'not json')`), idem.NewEventID().String())
		switch {
		case f.DynamicTyping && err != nil:
			t.Errorf("the outbox refused text in its timestamp, version and headers columns (%v): Features.DynamicTyping must be false", err)
		case !f.DynamicTyping && err == nil:
			t.Error("the outbox stored text in its timestamp, version and headers columns: set Features.DynamicTyping")
		}
		db.exec(t, `DELETE FROM outbox WHERE aggregateid = 'probe'`)
	})

	t.Run("SingleWriter", func(t *testing.T) {
		db.exec(t, `CREATE TABLE writers (id INTEGER NOT NULL PRIMARY KEY, n INTEGER NOT NULL)`)
		db.exec(t, `INSERT INTO writers (id, n) VALUES (1, 0), (2, 0)`)
		first := db.begin(t, ctx)
		_, err := db.Driver.Tx(first).Exec(ctx, db.bind(`UPDATE writers SET n = 1 WHERE id = 1`))
		fatalIf(t, err, "first writer")
		before := poolWaits(t, db.Driver, f.SingleWriter)
		second := make(chan error, 1)
		go func() {
			second <- db.inTx(ctx, func(ex driver.Executor) error {
				_, err := ex.Exec(ctx, db.bind(`UPDATE writers SET n = 2 WHERE id = 2`))
				return err
			})
		}()
		if f.SingleWriter {
			// The second writer waits for the pool's one connection, which
			// the first holds: wait until it does, failing if it runs.
			waitPool(t, db.Driver, before, "the second writer", second)
			db.rollback(ctx, first)
			fatalIf(t, <-second, "second writer after the first ended")
			return
		}
		select {
		case err := <-second:
			fatalIf(t, err, "second writer")
		case <-time.After(20 * time.Second):
			t.Error("a second writer of another row waited for the first: set Features.SingleWriter")
			db.rollback(ctx, first)
			<-second
		}
	})

	t.Run("TransactionalDDL", func(t *testing.T) {
		transactional := db.Driver.Dialect().MigrationSupport().TransactionalDDL
		err := db.inTx(ctx, func(ex driver.Executor) error {
			_, err := ex.Exec(ctx, `CREATE TABLE ddl_probe (n INTEGER NOT NULL)`)
			return err
		})
		fatalIf(t, err, "create a table in a transaction")
		_, err = pool.Exec(ctx, `INSERT INTO ddl_probe (n) VALUES (1)`)
		switch gone := err != nil && db.Driver.Dialect().IsMissingTable(err); {
		case transactional && !gone:
			t.Errorf("a table created in a transaction rolled back is still there (%v): MigrationSupport.TransactionalDDL must be false", err)
		case !transactional && gone:
			t.Error("a table created in a transaction rolled back is gone: MigrationSupport.TransactionalDDL can be true")
		}
	})
}

// poolWaits returns how many times a caller has waited for a connection
// of drv's database/sql pool, when single (Features.SingleWriter: the pool
// of a database with one writer has one connection, so that a writer waits
// for it rather than in the database's lock, where the suite cannot see
// it); else 0.
func poolWaits(t *testing.T, drv any, single bool) int64 {
	t.Helper()
	if !single {
		return 0
	}
	p, ok := drv.(interface{ DB() *sql.DB })
	if !ok {
		t.Fatalf("drivertest: with Features.SingleWriter the suite sees a writer wait through the driver's database/sql pool (a DB() *sql.DB method, as driver.SQLDriver has), which %T lacks", drv)
	}
	return p.DB().Stats().WaitCount
}

// waitPool waits until a caller waits for a connection of drv's pool
// (poolWaits grew past before), and fails if who ends first.
func waitPool(t *testing.T, drv any, before int64, who string, done <-chan error) {
	t.Helper()
	testsvc.WaitFor(t, 20*time.Second, who+" waiting for the pool's one connection (a SingleWriter database is opened with one)", func() bool {
		select {
		case err := <-done:
			t.Fatalf("%s ran (%v) while the first writer held its transaction: the database has row locks, Features.SingleWriter must be false", who, err)
		default:
		}
		return poolWaits(t, drv, true) > before
	})
}

// implements reports whether v implements I.
func implements[I any](v any) bool {
	_, ok := v.(I)
	return ok
}

// claimer returns the driver's OutboxClaimer, or nil.
func (db *DB[TTx]) claimer() driver.OutboxClaimer {
	c, _ := any(db.Driver).(driver.OutboxClaimer)
	return c
}
