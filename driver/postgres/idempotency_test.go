package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testdb"
)

// TestIdempotencyKeyLocksPerTable: the advisory lock of a key is the
// table's, even when two services name their tables without a schema and
// reach them through their own search_path: a key held in one must not
// hold up the same key in the other.
func TestIdempotencyKeyLocksPerTable(t *testing.T) {
	t.Parallel()
	a, b := testdb.NewPostgres(t), testdb.NewPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ref := driver.IdempotencyKeyRef{Key: "k-same"}
	lock := func(pg *testdb.PG) (func(), bool) {
		t.Helper()
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ok, err := pg.Driver.Dialect().(driver.IdempotencyKeyLocker).TryLockIdempotencyKey(ctx, pg.Driver.Tx(tx), ref)
		if err != nil {
			t.Fatal(err)
		}
		return func() { _ = tx.Rollback(ctx) }, ok
	}
	release, ok := lock(a)
	defer release()
	if !ok {
		t.Fatal("the first lock of a key was not taken")
	}
	release2, ok := lock(b)
	defer release2()
	if !ok {
		t.Fatal("a key held in one schema's table held up the same key in another schema's table")
	}
	release3, ok := lock(a)
	defer release3()
	if ok {
		t.Fatal("the same key of the same table was locked twice")
	}
}
