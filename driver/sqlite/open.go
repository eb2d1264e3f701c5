package sqlite

import (
	"database/sql"
	"fmt"
	"net/url"
	"strings"

	msqlite "modernc.org/sqlite"

	"github.com/idem-go/idem/driver/internal/stmtcache"
)

// DefaultPragmas are the connection settings Open adds unless the DSN sets
// them: a 10 s busy timeout (a writer waits for the lock instead of failing
// with "database is locked"), WAL journaling (readers do not block the
// writer) and foreign keys.
var DefaultPragmas = []string{"busy_timeout(10000)", "journal_mode(WAL)", "foreign_keys(1)"}

// DSN returns the modernc.org/sqlite DSN of path (a file path, or a
// file:path?params URI), with DefaultPragmas and _txlock=immediate unless it
// sets them. Immediate transactions take the write lock when they begin, so
// two transactions never deadlock upgrading a read lock (which SQLite
// reports as "database is locked" at once, whatever the busy timeout).
func DSN(path string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("idem: sqlite: empty database path")
	}
	base, rawQuery, _ := strings.Cut(path, "?")
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "", fmt.Errorf("idem: sqlite: parameters of %q: %w", path, err)
	}
	set := map[string]bool{}
	for _, p := range q["_pragma"] {
		name, _, _ := strings.Cut(p, "(")
		name, _, _ = strings.Cut(name, "=")
		set[strings.ToLower(strings.TrimSpace(name))] = true
	}
	for _, p := range DefaultPragmas {
		name, _, _ := strings.Cut(p, "(")
		if !set[name] {
			q.Add("_pragma", p)
		}
	}
	if !q.Has("_txlock") {
		q.Set("_txlock", "immediate")
	}
	if !strings.HasPrefix(base, "file:") {
		base = "file:" + base
	}
	return base + "?" + q.Encode(), nil
}

// Open opens the SQLite database at path (see DSN) with database/sql and
// modernc.org/sqlite, a pure-Go SQLite.
//
// The pool holds one connection: SQLite has one writer at a time, and
// goroutines queueing for the connection wait in order, where writers on
// several connections would poll the lock through the busy handler's sleeps
// and could time out under load. Handlers must therefore use the
// transaction they are given, never a second statement on the pool while
// they hold it. The busy timeout still covers other processes using the
// file (the idem CLI). Call SetMaxOpenConns to change it.
//
// Each connection keeps the statements it ran prepared (up to 128, those
// with at most 64 arguments), so that a statement run again, as the relay's
// claim and the consumer's marker are, is not parsed and planned again.
func Open(path string) (*sql.DB, error) {
	dsn, err := DSN(path)
	if err != nil {
		return nil, err
	}
	base, err := msqlite.NewConnector(dsn)
	if err != nil {
		return nil, fmt.Errorf("idem: sqlite: %w", err)
	}
	db := sql.OpenDB(stmtcache.NewConnector(base, stmtcache.Options{}))
	db.SetMaxOpenConns(1)
	return db, nil
}
