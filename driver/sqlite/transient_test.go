package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/migrate"
)

// TestIsTransientBusy takes the write lock on one connection and begins a
// write transaction on another without a busy timeout: SQLITE_BUSY, which
// is transient.
func TestIsTransientBusy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "busy.db")
	first, err := sqlite.Open(path + "?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := migrate.New(sqlite.New(first)).Up(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := sqlite.Open(path + "?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	holder, err := first.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback() }()
	if _, err := holder.ExecContext(ctx, `DELETE FROM processed_event`); err != nil {
		t.Fatal(err)
	}
	d := sqlite.New(second).Dialect()
	tx, err := second.BeginTx(ctx, nil)
	if err == nil {
		_ = tx.Rollback()
		t.Fatal("a second write transaction began while the first holds the write lock")
	}
	if !sqlite.IsBusy(err) || !d.IsTransient(err) {
		t.Errorf("begin while locked: %v; want a transient SQLITE_BUSY", err)
	}
	_, err = second.ExecContext(ctx, `INSERT INTO processed_event (consumer_name, event_id) VALUES ('stock', 'x')`)
	if err == nil || !d.IsTransient(err) {
		t.Errorf("insert while locked: %v; want a transient SQLITE_BUSY", err)
	}
}
