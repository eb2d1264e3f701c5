package idemtest

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/migrate"
)

// SQLite is a fresh SQLite database with idem's tables, for one test.
type SQLite struct {
	// DB is the database, for the application's own tables and
	// transactions.
	DB *sql.DB
	// Driver is idem's driver over DB (sqlite.New): what outbox.NewWriter,
	// inbox.New and relay.New take.
	Driver *driver.SQLDriver
}

// NewSQLite returns a fresh SQLite database in a file of t's temporary
// directory, migrated (migrate.Up), closed when the test ends. It costs a
// few milliseconds: one per test is the rule.
func NewSQLite(t testing.TB) *SQLite {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "idemtest.db"))
	if err != nil {
		t.Fatalf("idemtest: open SQLite: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	drv := sqlite.New(db)
	Migrate(t, drv)
	return &SQLite{DB: db, Driver: drv}
}

// Migrate applies idem's migrations to drv's database (migrate.Up), or
// fails t. Use it on a PostgreSQL or MySQL database the test made for
// itself (a fresh schema or database): postgres.NewPgx(pool),
// postgres.NewSQL(db), mysql.New(db).
func Migrate[TTx any](t testing.TB, drv driver.Driver[TTx]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		t.Fatalf("idemtest: migrate %s: %v", drv.Dialect().Name(), err)
	}
}

// Logger returns a logger that writes to t's output, as t.Log does: shown
// with the test when it fails, or under go test -v. Records logged after
// the test ended are dropped. The consumers of NewConsumer log there.
func Logger(t testing.TB) *slog.Logger {
	w := &testWriter{out: t.Output()}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, nil))
}

// testWriter writes to a test's output until the test ends.
type testWriter struct {
	mu     sync.Mutex
	out    io.Writer
	closed bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return len(p), nil
	}
	return w.out.Write(p)
}

func (w *testWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}

func ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}
