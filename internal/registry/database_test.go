package registry

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
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

// The polling relay of a SQLite database keeps its one connection, the
// database's single writer, whatever the workers, and publishes.
func TestNewRelaySQLite(t *testing.T) {
	ctx := context.Background()
	db, err := OpenDatabase(ctx, "sqlite:"+filepath.Join(t.TempDir(), "relay.db"), DatabaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := migrate.New(db.SQL).Up(ctx); err != nil {
		t.Fatal(err)
	}
	ev, err := idem.NewEvent("order.order.placed.v1", "order", "1", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.NewWriter(db.SQL).AddExec(ctx, db.SQL.Pool(), ev); err != nil {
		t.Fatal(err)
	}
	pub := memory.New()
	r, err := db.NewRelay(ctx, pub, relay.Config{Workers: 4, StatsInterval: -1, Retention: -1, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if n := db.DB.Stats().MaxOpenConnections; n != 1 || RelayConns(SQLite, 4) != 1 {
		t.Errorf("SQLite pool of %d connections (RelayConns %d), want 1", n, RelayConns(SQLite, 4))
	}
	if RelayConns(MySQL, 4) != 8 || RelayConns(Postgres, 2) != 6 {
		t.Errorf("RelayConns = %d (MySQL, 4 workers), %d (PostgreSQL, 2): want a connection per worker and 4 more", RelayConns(MySQL, 4), RelayConns(Postgres, 2))
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 30*time.Second, "the event published", func() bool { return r.Stats().Published == 1 })
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if msgs := pub.Messages(); len(msgs) != 1 || msgs[0].EventID != ev.ID {
		t.Errorf("published %v, want the event %s", msgs, ev.ID)
	}
}
