// Package testdb gives tests an isolated, migrated database on the servers the
// test command starts (make test). Tests that need a server fail, never skip,
// when its URL is missing.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testlock"
	"github.com/idem-go/idem/migrate"
)

// PostgresURLEnv names the variable holding the test PostgreSQL server's URL.
const PostgresURLEnv = "IDEM_TEST_POSTGRES_URL"

// pgLock keeps the test PostgreSQL server up while tests use it: see
// PostgresExclusive.
var pgLock = testlock.New("postgres")

func postgresURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(PostgresURLEnv)
	if u == "" {
		t.Fatalf("%s is not set: run the tests with `make test`, which starts a private PostgreSQL server", PostgresURLEnv)
	}
	return u
}

// PostgresURL returns the test server URL or fails the test. The server is
// not stopped by another test until this test ends.
func PostgresURL(t testing.TB) string {
	t.Helper()
	u := postgresURL(t)
	pgLock.Shared(t)
	return u
}

// PostgresExclusive returns the test server URL and holds the server alone
// until the test ends, so that it may call StopPostgres and StartPostgres:
// every other test of the run that uses PostgreSQL waits meanwhile. Call it
// first, in a test that does not run in parallel.
func PostgresExclusive(t testing.TB) string {
	t.Helper()
	u := postgresURL(t)
	pgLock.Exclusive(t)
	return u
}

// StopPostgres stops the test server, keeping its data; the test must hold
// it (PostgresExclusive).
func StopPostgres(t testing.TB) { t.Helper(); pgScript(t, "IDEM_TEST_POSTGRES_STOP") }

// StartPostgres starts the test server again and waits until it accepts
// connections, then empties the pools of the PGs of this process: their
// connections ended with the server, and a pool hands out a connection
// idle for less than a second without a ping.
func StartPostgres(t testing.TB) {
	t.Helper()
	pgScript(t, "IDEM_TEST_POSTGRES_START")
	pgPools.Lock()
	defer pgPools.Unlock()
	for p := range pgPools.m {
		p.Reset()
	}
}

// pgPools are the open pools of the PGs of this process.
var pgPools struct {
	sync.Mutex
	m map[*pgxpool.Pool]bool
}

func pgScript(t testing.TB, env string) {
	t.Helper()
	if !pgLock.HeldExclusively() {
		t.Fatalf("testdb: call PostgresExclusive before stopping or starting the server")
	}
	path := os.Getenv(env)
	if path == "" {
		t.Fatalf("%s is not set: run the tests with `make test`, which starts a private PostgreSQL server", env)
	}
	out, err := exec.Command(path).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", path, err, out)
	}
}

// PG is a fresh PostgreSQL schema with idem's tables, used through search_path.
type PG struct {
	// URL connects with search_path set to Schema, for child processes.
	URL string
	// Schema is the test's own schema.
	Schema string
	// Pool is a pgx pool on URL.
	Pool *pgxpool.Pool
	// Driver is a pgx driver on Pool with unqualified table names.
	Driver *postgres.PgxDriver
	// DB is a database/sql handle on URL (pgx stdlib).
	DB *sql.DB
}

// Options adjust NewPostgres.
type Options struct {
	// NoMigrate leaves the schema empty.
	NoMigrate bool
	// MaxConns sets the pool size (default 10).
	MaxConns int32
}

// NewPostgres creates a schema named idem_t_<random>, migrates it (unless
// opts.NoMigrate) and drops it when the test ends.
func NewPostgres(t testing.TB, opts ...Options) *PG {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	base := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	schema := "idem_t_" + randomHex(6)
	admin, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatalf("connect to test PostgreSQL: %v", err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+postgres.QuoteIdent(schema)); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgxpool.New(ctx, base)
		if err != nil {
			t.Errorf("connect to drop schema: %v", err)
			return
		}
		defer admin.Close()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+postgres.QuoteIdent(schema)+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})

	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", PostgresURLEnv, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pg := &PG{URL: u.String(), Schema: schema}

	cfg, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		t.Fatalf("parse pool config: %v", err)
	}
	cfg.MaxConns = 10
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
	}
	pg.Pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	pgPools.Lock()
	if pgPools.m == nil {
		pgPools.m = map[*pgxpool.Pool]bool{}
	}
	pgPools.m[pg.Pool] = true
	pgPools.Unlock()
	t.Cleanup(func() {
		pgPools.Lock()
		delete(pgPools.m, pg.Pool)
		pgPools.Unlock()
		pg.Pool.Close()
	})
	pg.DB, err = sql.Open("pgx", pg.URL)
	if err != nil {
		t.Fatalf("open database/sql: %v", err)
	}
	t.Cleanup(func() { _ = pg.DB.Close() })
	pg.Driver = postgres.NewPgx(pg.Pool)
	if !o.NoMigrate {
		if _, err := migrate.New(pg.Driver).Up(ctx); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	return pg
}

// Exec runs statements in the test schema or fails the test.
func (pg *PG) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := pg.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

// Count returns SELECT count(*) of the query's FROM/WHERE part, e.g.
// pg.Count(t, "processed_event WHERE consumer_name = $1", "stock").
func (pg *PG) Count(t testing.TB, fromWhere string, args ...any) int {
	t.Helper()
	var n int
	if err := pg.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+fromWhere, args...).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", fromWhere, err)
	}
	return n
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ExampleDatabase creates a migrated schema for runnable examples, which have
// no *testing.T, and returns its URL (search_path set) and a function that
// drops it. Call it from TestMain and hand the URL to the examples through
// an environment variable such as DATABASE_URL.
func ExampleDatabase() (string, func(), error) {
	base := os.Getenv(PostgresURLEnv)
	if base == "" {
		return "", nil, errMissingURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := "idem_ex_" + randomHex(6)
	admin, err := pgxpool.New(ctx, base)
	if err != nil {
		return "", nil, err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+postgres.QuoteIdent(schema)); err != nil {
		return "", nil, err
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if admin, err := pgxpool.New(ctx, base); err == nil {
			_, _ = admin.Exec(ctx, "DROP SCHEMA "+postgres.QuoteIdent(schema)+" CASCADE")
			admin.Close()
		}
	}
	u, err := url.Parse(base)
	if err != nil {
		drop()
		return "", nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		drop()
		return "", nil, err
	}
	defer pool.Close()
	if _, err := migrate.New(postgres.NewPgx(pool)).Up(ctx); err != nil {
		drop()
		return "", nil, err
	}
	return u.String(), drop, nil
}

var errMissingURL = errors.New(PostgresURLEnv + " is not set: run the tests with `make test`, which starts a private PostgreSQL server")

// RunWithExampleDatabase is a TestMain body for packages with runnable
// examples: it creates an example database, exports its URL as DATABASE_URL,
// runs setup statements in it, runs the tests, drops it, checks for leaked
// goroutines when the tests passed, and returns the exit code.
func RunWithExampleDatabase(m interface{ Run() int }, leakCheck func() error, setup ...string) int {
	// The examples have no *testing.T: hold the server for the whole run.
	release, err := pgLock.SharedForProcess()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer release()
	url, drop, err := ExampleDatabase()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer drop()
	os.Setenv("DATABASE_URL", url)
	if len(setup) > 0 {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for _, s := range setup {
			if _, err := conn.Exec(ctx, s); err != nil {
				fmt.Fprintf(os.Stderr, "example setup %q: %v\n", s, err)
				_ = conn.Close(ctx)
				return 1
			}
		}
		_ = conn.Close(ctx)
	}
	code := m.Run()
	if code == 0 && leakCheck != nil {
		if err := leakCheck(); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	return code
}

// WithPassword returns rawURL, a URL of the test server, with a random
// password for its user, and the password. The test server trusts local
// connections and never asks for it: it is there for the tests that check
// that a password given to a process never leaves it.
func WithPassword(t testing.TB, rawURL string) (withPassword, password string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.User == nil {
		t.Fatalf("testdb.WithPassword: want a URL with a user, got %v", err)
	}
	password = "pw" + randomHex(8)
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String(), password
}
