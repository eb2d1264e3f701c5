package stmtcache_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	msqlite "modernc.org/sqlite"

	"github.com/idem-go/idem/driver/internal/stmtcache"
)

// open returns a one-connection database on a fresh SQLite file, through a
// cache of size statements, and that connection.
func open(t *testing.T, size int) (*sql.DB, *sql.Conn) {
	t.Helper()
	base, err := msqlite.NewConnector("file:" + filepath.Join(t.TempDir(), "c.db") + "?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(stmtcache.NewConnector(base, stmtcache.Options{Size: size, MaxArgs: 8}))
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := conn.ExecContext(context.Background(), `CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db, conn
}

func cached(t *testing.T, conn *sql.Conn) int {
	t.Helper()
	var n int
	if err := conn.Raw(func(dc any) error { n = stmtcache.Len(dc); return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

func values(t *testing.T, conn *sql.Conn, query string, args ...any) []string {
	t.Helper()
	rows, err := conn.QueryContext(context.Background(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStatementsAreReused runs the same statements many times with other
// arguments: each is prepared once, and every run sees its own arguments.
func TestStatementsAreReused(t *testing.T) {
	ctx := context.Background()
	_, conn := open(t, 16)
	base := cached(t, conn)
	for i := range 50 {
		if _, err := conn.ExecContext(ctx, `INSERT INTO t (id, v) VALUES (?, ?)`, i, strings.Repeat("x", i)); err != nil {
			t.Fatal(err)
		}
		got := values(t, conn, `SELECT v FROM t WHERE id = ?`, i)
		if len(got) != 1 || got[0] != strings.Repeat("x", i) {
			t.Fatalf("row %d: got %q", i, got)
		}
	}
	if n := cached(t, conn) - base; n != 2 {
		t.Fatalf("%d statements cached, want 2 (the insert and the select)", n)
	}
}

// TestSameQueryWhileItsRowsAreOpen runs a query again while the rows of its
// first run are being read: the second run does not disturb the first.
func TestSameQueryWhileItsRowsAreOpen(t *testing.T) {
	ctx := context.Background()
	_, conn := open(t, 16)
	for i := range 5 {
		if _, err := conn.ExecContext(ctx, `INSERT INTO t (id, v) VALUES (?, ?)`, i, string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	const q = `SELECT v FROM t WHERE id >= ? ORDER BY id`
	outer, err := conn.QueryContext(ctx, q, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for outer.Next() {
		var v string
		if err := outer.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
		if inner := values(t, conn, q, 3); strings.Join(inner, "") != "de" {
			t.Fatalf("inner run: %q, want d e", inner)
		}
	}
	if err := outer.Err(); err != nil {
		t.Fatal(err)
	}
	if err := outer.Close(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "") != "abcde" {
		t.Fatalf("outer run: %q, want a b c d e", got)
	}
	if got := values(t, conn, q, 4); strings.Join(got, "") != "e" {
		t.Fatalf("after: %q", got)
	}
}

// TestEviction fills a cache of two statements, one of them with its rows
// open when it is evicted: its rows are read to the end, then it is closed.
func TestEviction(t *testing.T) {
	ctx := context.Background()
	_, conn := open(t, 2)
	if _, err := conn.ExecContext(ctx, `INSERT INTO t (id, v) VALUES (1, 'a'), (2, 'b')`); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.QueryContext(ctx, `SELECT v FROM t ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatal("no first row")
	}
	for _, q := range []string{`SELECT v FROM t WHERE id = 1`, `SELECT v FROM t WHERE id = 2`, `SELECT v FROM t WHERE id = 3`} {
		values(t, conn, q)
	}
	if n := cached(t, conn); n != 2 {
		t.Fatalf("%d statements cached, want 2", n)
	}
	var v string
	if !rows.Next() || rows.Scan(&v) != nil || v != "b" {
		t.Fatalf("second row of the evicted statement: %q, %v", v, rows.Err())
	}
	if rows.Next() {
		t.Fatal("a third row")
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestNotCached: statements with more than MaxArgs arguments, and
// statements that fail to prepare, are not kept; the error is the driver's.
func TestNotCached(t *testing.T) {
	ctx := context.Background()
	_, conn := open(t, 16)
	base := cached(t, conn)
	args := []any{1, 2, 3, 4, 5, 6, 7, 8, 9}
	if got := values(t, conn, `SELECT v FROM t WHERE id IN (?, ?, ?, ?, ?, ?, ?, ?, ?)`, args...); len(got) != 0 {
		t.Fatalf("rows %q", got)
	}
	_, err := conn.ExecContext(ctx, `INSERT INTO missing (id) VALUES (?)`, 1)
	if err == nil || !strings.Contains(err.Error(), "no such table: missing") {
		t.Fatalf("err = %v, want SQLite's no such table", err)
	}
	if n := cached(t, conn) - base; n != 0 {
		t.Fatalf("%d statements cached, want none", n)
	}
}

// TestSchemaChange: a cached statement still works after the table it reads
// changed, and after a rolled-back transaction.
func TestSchemaChange(t *testing.T) {
	ctx := context.Background()
	db, conn := open(t, 16)
	const ins = `INSERT INTO t (id, v) VALUES (?, ?)`
	if _, err := conn.ExecContext(ctx, ins, 1, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, `ALTER TABLE t ADD COLUMN w TEXT NOT NULL DEFAULT 'w'`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, ins, 2, "b"); err != nil {
		t.Fatal(err)
	}
	if got := values(t, conn, `SELECT v || w FROM t ORDER BY id`); strings.Join(got, ",") != "aw,bw" {
		t.Fatalf("rows %q", got)
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, ins, 3, "c"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("count = %d, %v; want 2", n, err)
	}
}
