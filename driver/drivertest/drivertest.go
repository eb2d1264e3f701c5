package drivertest

import (
	"context"
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

// DB is a fresh database for one test, on the connection API under test,
// made by a Setup.
type DB[TTx any] struct {
	// Driver is the driver under test, on the database, with the default
	// table names; migrated unless Options.NoMigrate. The suite runs every
	// check through it: its Pool for the statements it writes itself, its
	// transactions for the consumers, outbox writers, relays and migrators
	// it runs. Required.
	Driver driver.Driver[TTx]
	// Schema is the schema (PostgreSQL), database (MySQL) or attached
	// database (SQLite: "main") that holds the test's tables. The suite
	// qualifies table names with it. Required.
	Schema string
	// IsUniqueViolation reports whether err is a violation of the unique
	// key named key of table (the suite's own table and key). A database
	// whose errors name the key's columns rather than the key (SQLite) may
	// check the table alone. Required.
	IsUniqueViolation func(err error, table, key string) bool
	// Session returns an identifier of the connection behind ex (a backend
	// pid, a connection id). Required unless Features.SingleWriter.
	Session func(ctx context.Context, ex driver.Executor) (int64, error)
	// Blocking reports whether some connection waits for a lock held by the
	// session. Required unless Features.SingleWriter.
	Blocking func(ctx context.Context, session int64) (bool, error)
	// TextIDs, with Features.UUIDColumns, is a statement that turns the
	// test's outbox id column into text of up to 64 characters, as another
	// program's outbox may have it (Debezium's article: id VARCHAR(64)), so
	// that the suite checks ids that are not UUIDs on the dialect's relay
	// too. Required with Features.UUIDColumns.
	TextIDs string
	// Features say how the database takes and types values.
	Features Features
}

// Features are what the suite cannot learn from the driver: how the
// database takes arguments and types its columns. CheckFeatures tests each
// one against the database, so that a wrong value fails the suite instead
// of leaving checks out.
//
// What the driver says for itself, the suite asks it: a driver that
// implements driver.OutboxListener has its wake-ups checked (and a relay
// woken by them), one that implements driver.OutboxClaimer claims through
// it in the relay checks (as a relay on it does), and the dialect's
// MigrationSupport.TransactionalDDL is checked against the database.
type Features struct {
	// Placeholders is how the suite's statements refer to their
	// arguments. Defaults to QuestionMarks.
	Placeholders Placeholders
	// TimeArg turns a time into a query argument that the timestamp
	// columns store and compare as that time: the dialect's own form
	// (MySQL and SQLite: UTC text, sqltime.Format). Nil passes the
	// time.Time as it is.
	TimeArg func(time.Time) any
	// UUIDColumns is true when the event id columns have a UUID type that
	// refuses any other value (PostgreSQL): idem's own outbox cannot hold
	// an id that is not a UUID, and the suite checks such ids on a copy of
	// the outbox whose id column DB.TextIDs makes text. When false they
	// are text: the suite writes outbox rows whose id is not a UUID, as
	// another program may, and checks that the relay publishes those of 1
	// to 64 bytes under the id idem.EventID derives, and quarantines the
	// others.
	UUIDColumns bool
	// DynamicTyping is true when a column takes a value of any type
	// (SQLite): the suite writes outbox rows whose timestamp, version and
	// headers hold text that is none of these, and checks that a claim
	// reports them unreadable.
	DynamicTyping bool
	// SingleWriter is true when the database runs one write transaction at
	// a time (SQLite): a second writer waits until the first ends, whatever
	// rows they write. There are no row locks to observe, so DB.Session and
	// DB.Blocking are not needed, and the checks of lock waits, lock
	// timeouts and deadlocks do not apply. The suite sees a second writer
	// wait for the connection of the driver's database/sql pool (a
	// DB() *sql.DB method, as driver.SQLDriver has), which must hold one
	// connection, as the idem SQLite driver's does.
	SingleWriter bool
}

// Placeholders says how statements refer to their arguments.
type Placeholders int

const (
	// QuestionMarks: ? for each argument, in order (MySQL, SQLite).
	QuestionMarks Placeholders = iota
	// DollarNumbers: $1, $2, ... (PostgreSQL).
	DollarNumbers
)

// Setup makes a fresh database for t; it must clean it up when t ends and
// fail t (never skip) when its server is missing.
type Setup[TTx any] func(t *testing.T, o Options) *DB[TTx]

// open calls s and checks that the DB it returns has what the suite needs.
func (s Setup[TTx]) open(t *testing.T, o Options) *DB[TTx] {
	t.Helper()
	db := s(t, o)
	switch {
	case db == nil || db.Driver == nil:
		t.Fatal("drivertest: the setup returned no DB.Driver")
	case db.Schema == "":
		t.Fatal("drivertest: DB.Schema is required (the schema, database or attached database of the test's tables)")
	case db.IsUniqueViolation == nil:
		t.Fatal("drivertest: DB.IsUniqueViolation is required")
	case !db.Features.SingleWriter && (db.Session == nil || db.Blocking == nil):
		t.Fatal("drivertest: DB.Session and DB.Blocking are required unless Features.SingleWriter")
	case db.Features.UUIDColumns && db.TextIDs == "":
		t.Fatal("drivertest: DB.TextIDs is required with Features.UUIDColumns")
	}
	return db
}

// Run runs the whole suite against the databases setup makes. Run it once
// per connection API of a dialect (PostgreSQL: pgx and database/sql).
func Run[TTx any](t *testing.T, setup Setup[TTx]) {
	t.Run("Features", func(t *testing.T) { t.Parallel(); CheckFeatures(t, setup) })
	t.Run("Migrations", func(t *testing.T) { t.Parallel(); Migrations(t, setup) })
	t.Run("Outbox", func(t *testing.T) { t.Parallel(); Outbox(t, setup) })
	t.Run("Inbox", func(t *testing.T) { t.Parallel(); Inbox(t, setup) })
	t.Run("Consumer", func(t *testing.T) { t.Parallel(); Consumer(t, setup) })
	t.Run("FailureStore", func(t *testing.T) { t.Parallel(); FailureStore(t, setup) })
	t.Run("FailureStoreBytes", func(t *testing.T) { t.Parallel(); FailureStoreBytes(t, setup) })
	t.Run("FailureStorePaging", func(t *testing.T) { t.Parallel(); FailureStorePaging(t, setup) })
	t.Run("FailureStoreOneEntry", func(t *testing.T) { t.Parallel(); FailureStoreOneEntry(t, setup) })
	t.Run("FailureStoreOperations", func(t *testing.T) { t.Parallel(); FailureStoreOperations(t, setup) })
	t.Run("FailureNotices", func(t *testing.T) { t.Parallel(); FailureNotices(t, setup) })
	t.Run("ParkedAggregates", func(t *testing.T) { t.Parallel(); ParkedAggregates(t, setup) })
	t.Run("Attempts", func(t *testing.T) { t.Parallel(); Attempts(t, setup) })
	t.Run("ConsumerCounts", func(t *testing.T) { t.Parallel(); ConsumerCounts(t, setup) })
	t.Run("Purge", func(t *testing.T) { t.Parallel(); Purge(t, setup) })
	t.Run("PurgeFailed", func(t *testing.T) { t.Parallel(); PurgeFailed(t, setup) })
	t.Run("Transient", func(t *testing.T) { t.Parallel(); Transient(t, setup) })
	t.Run("ResultErrors", func(t *testing.T) { t.Parallel(); ResultErrors(t, setup) })
	t.Run("StateCopy", func(t *testing.T) { t.Parallel(); StateCopy(t, setup) })
	t.Run("Relay", func(t *testing.T) { t.Parallel(); Relay(t, setup) })
	t.Run("Delayed", func(t *testing.T) { t.Parallel(); Delayed(t, setup) })
	t.Run("IdempotencyKeys", func(t *testing.T) { t.Parallel(); IdempotencyKeys(t, setup) })
	t.Run("Status", func(t *testing.T) { t.Parallel(); Status(t, setup) })
	t.Run("GroupLeases", func(t *testing.T) { t.Parallel(); GroupLeases(t, setup) })
	t.Run("Archive", func(t *testing.T) { t.Parallel(); Archive(t, setup) })
	t.Run("Pauses", func(t *testing.T) { t.Parallel(); Pauses(t, setup) })
}

// --- helpers ---

// bind rewrites a statement written with ? placeholders in the database's
// placeholders.
func (db *DB[TTx]) bind(query string) string {
	if db.Features.Placeholders != DollarNumbers {
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

// exec runs a statement (? placeholders) on the pool or fails the test.
func (db *DB[TTx]) exec(t testing.TB, query string, args ...any) {
	t.Helper()
	if _, err := db.Driver.Pool().Exec(context.Background(), db.bind(query), args...); err != nil {
		t.Fatalf("exec %q: %v", query, err)
	}
}

// queryRow runs a query (? placeholders) on the pool and scans its one row
// into dest, or fails the test.
func (db *DB[TTx]) queryRow(t testing.TB, query string, args []any, dest ...any) {
	t.Helper()
	if err := driver.QueryRow(context.Background(), db.Driver.Pool(), db.bind(query), args, dest...); err != nil {
		t.Fatalf("query %q: %v", query, err)
	}
}

// count returns SELECT COUNT(*) FROM fromWhere.
func (db *DB[TTx]) count(t testing.TB, fromWhere string, args ...any) int {
	t.Helper()
	var n int
	db.queryRow(t, "SELECT COUNT(*) FROM "+fromWhere, args, &n)
	return n
}

// timeArg is t as a query argument comparable with the timestamp columns.
func (db *DB[TTx]) timeArg(t time.Time) any {
	if db.Features.TimeArg == nil {
		return t
	}
	return db.Features.TimeArg(t)
}

// inTx runs fn with the executor of a new transaction, then rolls the
// transaction back.
func (db *DB[TTx]) inTx(ctx context.Context, fn func(ex driver.Executor) error) error {
	tx, err := db.Driver.Begin(ctx)
	if err != nil {
		return err
	}
	defer db.rollback(ctx, tx)
	return fn(db.Driver.Tx(tx))
}

// rollback rolls tx back, whatever ctx says.
func (db *DB[TTx]) rollback(ctx context.Context, tx TTx) {
	_ = db.Driver.Rollback(context.WithoutCancel(ctx), tx)
}

// begin starts a transaction or fails the test; it is rolled back when the
// test ends, unless committed before.
func (db *DB[TTx]) begin(t testing.TB, ctx context.Context) TTx {
	t.Helper()
	tx, err := db.Driver.Begin(ctx)
	fatalIf(t, err, "begin")
	t.Cleanup(func() { db.rollback(ctx, tx) })
	return tx
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

func fatalIf(t testing.TB, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}
