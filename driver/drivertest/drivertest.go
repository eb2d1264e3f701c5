package drivertest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/sqltime"
)

// Options are what a test asks of its database.
type Options struct {
	// NoMigrate leaves the database without idem's tables.
	NoMigrate bool
}

// DB is a fresh database for one test, made by a Setup.
type DB struct {
	// Driver is a database/sql driver on the database with the default
	// table names; migrated unless Options.NoMigrate.
	Driver *driver.SQLDriver
	// IsUniqueViolation reports whether err is a unique-key violation, on
	// any key. Required.
	IsUniqueViolation func(err error) bool
	// Session returns an identifier of the connection behind ex (a backend
	// pid or connection id). Nil when locks cannot be observed (SQLite,
	// where a second writer waits for the database's single write lock).
	Session func(ctx context.Context, ex driver.Executor) (int64, error)
	// Blocking reports whether some connection waits for a lock held by the
	// session. Required with Session.
	Blocking func(ctx context.Context, session int64) (bool, error)
	// Claimer, when set, is the driver.OutboxClaimer the relay checks claim
	// through, as a relay on that driver does, instead of
	// RelayDialect.ClaimOutbox in a transaction of Driver's.
	Claimer driver.OutboxClaimer
	// Conns are other connection APIs on the same database (PostgreSQL:
	// the pgx driver). The failure store's byte-for-byte checks and the
	// checks of how results are read run on each of them too.
	Conns []Conn
}

// Conn is one connection API on the test database: its executors, for the
// checks that run on every connection API.
type Conn struct {
	// Name names the connection API in subtest names ("pgx").
	Name string
	// Pool runs each statement outside any transaction.
	Pool driver.Executor
	// InTx runs fn with the executor of a new transaction, then rolls the
	// transaction back.
	InTx func(ctx context.Context, fn func(ex driver.Executor) error) error
}

// poolOf is a dialect on one connection API's pool, for inbox.NewFailureStore.
type poolOf struct {
	dialect driver.Dialect
	pool    driver.Executor
}

func (p poolOf) Dialect() driver.Dialect { return p.dialect }
func (p poolOf) Pool() driver.Executor   { return p.pool }

// ConnOf returns the Conn of drv.
func ConnOf[TTx any](name string, drv driver.Driver[TTx]) Conn {
	return Conn{
		Name: name,
		Pool: drv.Pool(),
		InTx: func(ctx context.Context, fn func(ex driver.Executor) error) error {
			tx, err := drv.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = drv.Rollback(context.WithoutCancel(ctx), tx) }()
			return fn(drv.Tx(tx))
		},
	}
}

// conns returns the database/sql connection of db, then db.Conns.
func (db *DB) conns() []Conn {
	return append([]Conn{ConnOf("database/sql", db.Driver)}, db.Conns...)
}

// Setup makes a fresh database for t; it must clean it up when t ends and
// fail t (never skip) when its server is missing.
type Setup func(t *testing.T, o Options) *DB

// Run runs the whole suite against the databases setup makes.
func Run(t *testing.T, setup Setup) {
	t.Run("Migrations", func(t *testing.T) { t.Parallel(); Migrations(t, setup) })
	t.Run("Outbox", func(t *testing.T) { t.Parallel(); Outbox(t, setup) })
	t.Run("Inbox", func(t *testing.T) { t.Parallel(); Inbox(t, setup) })
	t.Run("FailureStore", func(t *testing.T) { t.Parallel(); FailureStore(t, setup) })
	t.Run("FailureStoreBytes", func(t *testing.T) { t.Parallel(); FailureStoreBytes(t, setup) })
	t.Run("FailureStorePaging", func(t *testing.T) { t.Parallel(); FailureStorePaging(t, setup) })
	t.Run("ParkedAggregates", func(t *testing.T) { t.Parallel(); ParkedAggregates(t, setup) })
	t.Run("Attempts", func(t *testing.T) { t.Parallel(); Attempts(t, setup) })
	t.Run("Purge", func(t *testing.T) { t.Parallel(); Purge(t, setup) })
	t.Run("PurgeFailed", func(t *testing.T) { t.Parallel(); PurgeFailed(t, setup) })
	t.Run("Transient", func(t *testing.T) { t.Parallel(); Transient(t, setup) })
	t.Run("ResultErrors", func(t *testing.T) { t.Parallel(); ResultErrors(t, setup) })
	t.Run("StateCopy", func(t *testing.T) { t.Parallel(); StateCopy(t, setup) })
	t.Run("Relay", func(t *testing.T) { t.Parallel(); Relay(t, setup) })
	t.Run("IdempotencyKeys", func(t *testing.T) { t.Parallel(); IdempotencyKeys(t, setup) })
}

// --- helpers ---

func (db *DB) dialect() string { return db.Driver.Dialect().Name() }

// bind rewrites ? placeholders as $n for PostgreSQL.
func (db *DB) bind(query string) string {
	if db.dialect() != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// exec runs a statement outside transactions or fails the test.
func (db *DB) exec(t testing.TB, query string, args ...any) {
	t.Helper()
	if _, err := db.Driver.DB().ExecContext(context.Background(), db.bind(query), args...); err != nil {
		t.Fatalf("exec %q: %v", query, err)
	}
}

// count returns SELECT COUNT(*) FROM fromWhere.
func (db *DB) count(t testing.TB, fromWhere string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Driver.DB().QueryRowContext(context.Background(), db.bind("SELECT COUNT(*) FROM "+fromWhere), args...).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", fromWhere, err)
	}
	return n
}

// timeArg is t as a query argument comparable with the timestamp columns.
func (db *DB) timeArg(t time.Time) any {
	if db.dialect() == "postgres" {
		return t
	}
	return sqltime.Format(t)
}

// timeScanner scans a timestamp column of any dialect into t (UTC).
type timeScanner struct{ t *time.Time }

func (s timeScanner) Scan(src any) error {
	if v, ok := src.(time.Time); ok {
		*s.t = v.UTC()
		return nil
	}
	return sqltime.Scanner(s.t).Scan(src)
}

// reservationTable is an application table with its own unique key.
const reservationTable = `CREATE TABLE reservation (
    order_id   VARCHAR(64)  NOT NULL,
    product_id VARCHAR(100) NOT NULL,
    quantity   INTEGER      NOT NULL,
    CONSTRAINT reservation_order_product UNIQUE (order_id, product_id)
)`

func placed(t testing.TB, orderID string) idem.Event {
	t.Helper()
	ev, err := idem.NewEvent("order.order.placed.v1", "order", orderID, map[string]any{"order_id": orderID})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func changed(t testing.TB, aggregate string, version int) idem.Event {
	t.Helper()
	ev, err := idem.NewEvent("order.order.changed.v1", "order", aggregate, map[string]any{"version": version})
	if err != nil {
		t.Fatal(err)
	}
	ev.AggregateVersion = int64(version)
	return ev
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func rollback(tx *sql.Tx) { _ = tx.Rollback() }

func fatalIf(t testing.TB, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}
