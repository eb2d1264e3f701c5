package mysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// stateCopyTable creates the state copy of the shop's shipping service.
func stateCopyTable(t *testing.T) *testdb.SQLDB {
	t.Helper()
	db := testdb.NewMariaDB(t)
	db.Exec(t, `CREATE TABLE order_status (order_id VARCHAR(64) NOT NULL PRIMARY KEY, version BIGINT NOT NULL, status VARCHAR(20) NOT NULL) ENGINE=InnoDB`)
	return db
}

func upsertStatus(ctx context.Context, db *testdb.SQLDB, tx *sql.Tx, key string, version int64, status string) (driver.UpsertVersionedResult, error) {
	return db.Driver.Dialect().UpsertVersioned(ctx, db.Driver.Tx(tx), driver.UpsertVersionedParams{
		Table: "order_status", KeyColumn: "order_id", VersionColumn: "version", Columns: []string{"status"},
		Key: key, Version: version, Values: []any{status},
	})
}

func begin(t *testing.T, ctx context.Context, db *testdb.SQLDB) *sql.Tx {
	t.Helper()
	tx, err := db.Driver.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// TestUpsertVersionedNewKeysDoNotWait checks that transactions copying the
// state of new aggregates, as the workers of one consumer do for new
// orders, do not wait for each other: a locking read of a key that is not
// there yet would lock the gap where it goes (InnoDB, REPEATABLE READ), and
// the inserts of two such transactions into one gap would deadlock.
func TestUpsertVersionedNewKeysDoNotWait(t *testing.T) {
	t.Parallel()
	db := stateCopyTable(t)
	ctx := testsvc.Ctx(t, time.Minute)
	tx1, tx2 := begin(t, ctx, db), begin(t, ctx, db)
	steps := []struct {
		tx  *sql.Tx
		key string
	}{{tx1, "0193-a"}, {tx2, "0193-b"}, {tx1, "0193-c"}, {tx2, "0193-0"}}
	for _, s := range steps {
		// A wait for the other transaction would end in this timeout
		// (or a deadlock): none may happen.
		stepCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := upsertStatus(stepCtx, db, s.tx, s.key, 1, "confirmed")
		cancel()
		if err != nil {
			t.Fatalf("upsert %s: %v", s.key, err)
		}
		if !res.Applied || res.Previous != 0 {
			t.Errorf("upsert %s = %+v, want applied, no previous", s.key, res)
		}
	}
	for _, tx := range []*sql.Tx{tx1, tx2} {
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if n := db.Count(t, "order_status WHERE version = 1"); n != 4 {
		t.Errorf("%d rows, want 4", n)
	}
}

// TestUpsertVersionedCommittedMeanwhile checks a key inserted and committed
// by another transaction after this one's snapshot: invisible to a plain
// read, it is read again, locked, and the version check applies to it.
func TestUpsertVersionedCommittedMeanwhile(t *testing.T) {
	t.Parallel()
	db := stateCopyTable(t)
	ctx := testsvc.Ctx(t, time.Minute)
	tx := begin(t, ctx, db)
	// The transaction's snapshot is taken at its first read.
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM order_status`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `INSERT INTO order_status (order_id, version, status) VALUES ('42', 2, 'paid')`)
	for _, c := range []struct {
		version        int64
		status         string
		applied        bool
		previous       int64
		stored         int64
		storedAsStatus string
	}{
		{1, "confirmed", false, 2, 2, "paid"},
		{3, "cancelled", true, 2, 3, "cancelled"},
	} {
		res, err := upsertStatus(ctx, db, tx, "42", c.version, c.status)
		if err != nil {
			t.Fatalf("v%d: %v", c.version, err)
		}
		if res.Applied != c.applied || res.Previous != c.previous {
			t.Errorf("v%d = %+v, want applied %v, previous %d", c.version, res, c.applied, c.previous)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var (
		version int64
		status  string
	)
	if err := db.DB.QueryRowContext(ctx, `SELECT version, status FROM order_status WHERE order_id = '42'`).Scan(&version, &status); err != nil {
		t.Fatal(err)
	}
	if version != 3 || status != "cancelled" {
		t.Errorf("stored %q v%d, want cancelled v3", status, version)
	}
}

// TestUpsertVersionedSameKeyWaits checks that two transactions copying the
// state of one aggregate are serialised on its row: the second waits for
// the first, then sees its version.
func TestUpsertVersionedSameKeyWaits(t *testing.T) {
	t.Parallel()
	for _, existing := range []bool{false, true} {
		name := map[bool]string{false: "new key", true: "existing key"}[existing]
		t.Run(name, func(t *testing.T) {
			db := stateCopyTable(t)
			ctx := testsvc.Ctx(t, time.Minute)
			if existing {
				db.Exec(t, `INSERT INTO order_status (order_id, version, status) VALUES ('42', 1, 'confirmed')`)
			}
			tx1, tx2 := begin(t, ctx, db), begin(t, ctx, db)
			var conn2 int64
			if err := tx2.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&conn2); err != nil {
				t.Fatal(err)
			}
			if _, err := upsertStatus(ctx, db, tx1, "42", 2, "paid"); err != nil {
				t.Fatal(err)
			}
			type result struct {
				res driver.UpsertVersionedResult
				err error
			}
			second := make(chan result, 1)
			go func() {
				res, err := upsertStatus(ctx, db, tx2, "42", 3, "cancelled")
				second <- result{res, err}
			}()
			// The second transaction's connection running its locking read or
			// its insert of the key: tx1 holds the row, so it waits. (MariaDB
			// refreshes INNODB_TRX only when nobody read it for 100 ms, which
			// parallel tests polling it prevent; PROCESSLIST is live.)
			testsvc.WaitFor(t, 30*time.Second, "the second transaction waiting for the first's row", func() bool {
				var n int
				err := db.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE ID = ? AND COMMAND = 'Query' AND (INFO LIKE '%FOR UPDATE' OR INFO LIKE 'INSERT INTO%')`, conn2).Scan(&n)
				return err == nil && n > 0
			})
			if err := tx1.Commit(); err != nil {
				t.Fatal(err)
			}
			r := <-second
			if r.err != nil {
				t.Fatalf("second upsert: %v", r.err)
			}
			if !r.res.Applied || r.res.Previous != 2 {
				t.Errorf("second upsert = %+v, want applied over version 2", r.res)
			}
			if err := tx2.Commit(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
