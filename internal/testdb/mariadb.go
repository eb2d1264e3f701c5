package testdb

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/internal/testlock"
	"github.com/idem-go/idem/migrate"
)

// MariaDBURLEnv names the variable holding the test MariaDB server's URL
// (mysql://user:pass@host:port/db).
const MariaDBURLEnv = "IDEM_TEST_MARIADB_URL"

// mariaLock keeps the test MariaDB server up while tests use it: see
// MariaDBExclusive.
var mariaLock = testlock.New("mariadb")

func mariaDBURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(MariaDBURLEnv)
	if u == "" {
		t.Fatalf("%s is not set: run the tests with `make test` (IDEM_TEST_SERVERS=\"postgres mariadb\"), which starts a private MariaDB server", MariaDBURLEnv)
	}
	return u
}

// MariaDBURL returns the test server URL or fails the test. The server is
// not stopped by another test until this test ends.
func MariaDBURL(t testing.TB) string {
	t.Helper()
	u := mariaDBURL(t)
	mariaLock.Shared(t)
	return u
}

// MariaDBExclusive returns the test server URL and holds the server alone
// until the test ends, so that it may call RestartMariaDB: every other test
// of the run that uses MariaDB waits meanwhile. Call it first, in a test
// that does not run in parallel.
func MariaDBExclusive(t testing.TB) string {
	t.Helper()
	u := mariaDBURL(t)
	mariaLock.Exclusive(t)
	return u
}

// RestartMariaDB stops the test server, keeping its data, and starts it
// again; the test must hold it (MariaDBExclusive).
func RestartMariaDB(t testing.TB) {
	t.Helper()
	if !mariaLock.HeldExclusively() {
		t.Fatalf("testdb: call MariaDBExclusive before restarting the server")
	}
	for _, env := range []string{"IDEM_TEST_MARIADB_STOP", "IDEM_TEST_MARIADB_START"} {
		path := os.Getenv(env)
		if path == "" {
			t.Fatalf("%s is not set: run the tests with `make test`, which starts a private MariaDB server", env)
		}
		if out, err := exec.Command(path).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", path, err, out)
		}
	}
}

// SQLDB is a fresh MariaDB database or SQLite file with idem's tables.
type SQLDB struct {
	// URL connects to the database (mysql://… or a SQLite file path).
	URL string
	// Name is the MariaDB database name, or the SQLite file path.
	Name string
	// DB is the database/sql handle.
	DB *sql.DB
	// Driver is a driver on DB with the default table names.
	Driver *driver.SQLDriver
}

// NewMariaDB creates a database named idem_t_<random> on the test MariaDB
// server, migrates it (unless opts.NoMigrate) and drops it when the test
// ends.
func NewMariaDB(t testing.TB, opts ...Options) *SQLDB {
	t.Helper()
	return newMariaDB(t, MariaDBURL(t), opts...)
}

// newMariaDB creates a fresh database on the server of the URL base, as
// NewMariaDB does.
func newMariaDB(t testing.TB, base string, opts ...Options) *SQLDB {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "idem_t_" + randomHex(6)
	admin, err := mysql.Open(base)
	if err != nil {
		t.Fatalf("open test MariaDB: %v", err)
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+mysql.QuoteIdent(name)+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := mysql.Open(base)
		if err != nil {
			t.Errorf("open to drop database: %v", err)
			return
		}
		defer admin.Close()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE "+mysql.QuoteIdent(name)); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", MariaDBURLEnv, err)
	}
	u.Path = "/" + name
	m := &SQLDB{URL: u.String(), Name: name}
	m.DB, err = mysql.Open(m.URL)
	if err != nil {
		t.Fatalf("open database: %v", err)
	}
	maxConns := 10
	if o.MaxConns > 0 {
		maxConns = int(o.MaxConns)
	}
	m.DB.SetMaxOpenConns(maxConns)
	m.DB.SetMaxIdleConns(maxConns)
	t.Cleanup(func() { _ = m.DB.Close() })
	m.Driver = mysql.New(m.DB)
	if !o.NoMigrate {
		if _, err := migrate.New(m.Driver).Up(ctx); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	return m
}

// NewSQLite creates a SQLite database in a file of t.TempDir(), opened with
// sqlite.Open (WAL, busy timeout, immediate transactions), and migrates it
// (unless opts.NoMigrate).
func NewSQLite(t testing.TB, opts ...Options) *SQLDB {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := filepath.Join(t.TempDir(), "idem.db")
	s := &SQLDB{URL: path, Name: path}
	var err error
	s.DB, err = sqlite.Open(path)
	if err != nil {
		t.Fatalf("open SQLite: %v", err)
	}
	if o.MaxConns > 0 {
		s.DB.SetMaxOpenConns(int(o.MaxConns))
	}
	t.Cleanup(func() { _ = s.DB.Close() })
	s.Driver = sqlite.New(s.DB)
	if !o.NoMigrate {
		if _, err := migrate.New(s.Driver).Up(ctx); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	return s
}

// Exec runs a statement (placeholders ?) or fails the test.
func (s *SQLDB) Exec(t testing.TB, query string, args ...any) {
	t.Helper()
	if _, err := s.DB.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("exec %q: %v", query, err)
	}
}

// Count returns SELECT COUNT(*) of the query's FROM/WHERE part, e.g.
// s.Count(t, "processed_event WHERE consumer_name = ?", "stock").
func (s *SQLDB) Count(t testing.TB, fromWhere string, args ...any) int {
	t.Helper()
	var n int
	if err := s.DB.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+fromWhere, args...).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", fromWhere, err)
	}
	return n
}

// IsSQLite reports whether s is a SQLite database.
func (s *SQLDB) IsSQLite() bool { return !strings.Contains(s.URL, "://") }
