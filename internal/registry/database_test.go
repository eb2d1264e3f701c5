package registry

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// sqlite: names one meaning everywhere: a database file, or, with a
// database name (the shop's services), the directory of <name>.db files.
func TestOpenSQLite(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for _, u := range []string{
		"sqlite:" + filepath.Join(dir, "a.db"),
		"sqlite://" + filepath.Join(dir, "b.db"),
		"file:" + filepath.Join(dir, "c.db") + "?_pragma=busy_timeout(5000)",
	} {
		db, err := OpenDatabase(ctx, u, DatabaseOptions{})
		if err != nil {
			t.Fatalf("open %s: %v", u, err)
		}
		if db.Dialect != SQLite || db.SQL.Dialect().Name() != "sqlite" {
			t.Errorf("%s: dialect %s", u, db.Dialect)
		}
		db.Close()
	}
	if _, err := OpenDatabase(ctx, "sqlite:"+filepath.Join(dir, "d.db"), DatabaseOptions{Tables: idem.Tables{Schema: "x"}}); err == nil {
		t.Error("sqlite with a schema: want an error")
	}
	// With a name: DIR/<name>.db, DIR created.
	svc := filepath.Join(dir, "shop")
	db, err := OpenDatabase(ctx, "sqlite:"+svc, DatabaseOptions{Name: "shop_order"})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if db.File != filepath.Join(svc, "shop_order.db") {
		t.Errorf("file %s, want %s", db.File, filepath.Join(svc, "shop_order.db"))
	}
	if _, err := os.Stat(db.File); err != nil {
		t.Fatal(err)
	}
	// The same file opened by its path, as "idem failed list" does.
	db, err = OpenDatabase(ctx, "sqlite:"+db.File, DatabaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	// A directory without a name says what to give.
	if _, err := OpenDatabase(ctx, "sqlite:"+svc, DatabaseOptions{}); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("a directory without a name: %v; want an error naming the file to give", err)
	}
	for _, u := range []string{"", "nosuch://x", "postgres"} {
		if _, err := OpenDatabase(ctx, u, DatabaseOptions{}); err == nil {
			t.Errorf("OpenDatabase(%q) accepted", u)
		}
	}
}
