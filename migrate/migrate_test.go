package migrate_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/migrate"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

func TestUpStatusDown(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: true})
	ctx := context.Background()
	m := migrate.New(pg.Driver)

	st, err := m.Status(ctx)
	if err != nil || len(st) == 0 || st[0].Applied {
		t.Fatalf("status before = %+v, %v; want pending migrations", st, err)
	}
	applied, err := m.Up(ctx)
	if err != nil || len(applied) != len(st) {
		t.Fatalf("up = %d applied, %v; want %d", len(applied), err, len(st))
	}
	for _, table := range []string{"outbox", "processed_event", "failed_message"} {
		if n := pg.Count(t, "pg_tables WHERE schemaname = $1 AND tablename = $2", pg.Schema, table); n != 1 {
			t.Errorf("table %s missing after up", table)
		}
	}
	// From the catalogs, not pg_indexes: its pg_get_indexdef() fails on an
	// index that a test running in another schema drops meanwhile.
	if n := pg.Count(t, `pg_index i
		JOIN pg_class t ON t.oid = i.indrelid
		JOIN pg_namespace s ON s.oid = t.relnamespace
		JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = i.indkey[0]
		WHERE s.nspname = $1 AND t.relname = 'processed_event' AND i.indnatts = 1 AND a.attname = 'processed_at'`, pg.Schema); n != 1 {
		t.Error("processed_event has no index on processed_at")
	}
	again, err := m.Up(ctx)
	if err != nil || len(again) != 0 {
		t.Fatalf("second up = %d applied, %v; want a no-op", len(again), err)
	}
	st, _ = m.Status(ctx)
	for _, s := range st {
		if !s.Applied {
			t.Errorf("migration %d not applied", s.Version)
		}
	}
	reverted, err := m.Down(ctx, 0)
	if err != nil || len(reverted) != len(st) {
		t.Fatalf("down all = %d, %v", len(reverted), err)
	}
	if n := pg.Count(t, "pg_tables WHERE schemaname = $1 AND tablename <> 'idem_schema_migration'", pg.Schema); n != 0 {
		t.Errorf("%d tables left after down", n)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up after down: %v", err)
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `INSERT INTO idem_schema_migration (version, name) VALUES (9999, 'from_the_future')`)
	_, err := migrate.New(pg.Driver).Up(context.Background())
	if !errors.Is(err, migrate.ErrSchemaNewer) || !strings.Contains(err.Error(), "9999") {
		t.Fatalf("up on a newer schema: %v; want ErrSchemaNewer naming version 9999", err)
	}
	st, err := migrate.New(pg.Driver).Status(context.Background())
	if err != nil || !st[len(st)-1].Unknown {
		t.Fatalf("status = %+v, %v; want the unknown version listed", st, err)
	}
}

func TestConcurrentUpAppliesOnce(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: true})
	var wg sync.WaitGroup
	counts := make([]int, 4)
	errs := make([]error, 4)
	for i := range counts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied, err := migrate.New(pg.Driver).Up(context.Background())
			counts[i], errs[i] = len(applied), err
		}()
	}
	wg.Wait()
	total := 0
	for i := range counts {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		total += counts[i]
	}
	if want := len(pgMigrations(t, pg)); total != want {
		t.Fatalf("migrations applied in all = %d, want %d (each once)", total, want)
	}
}

func pgMigrations(t *testing.T, pg *testdb.PG) []int {
	var out []int
	rows, err := pg.Pool.Query(context.Background(), `SELECT version FROM idem_schema_migration`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		_ = rows.Scan(&v)
		out = append(out, v)
	}
	return out
}

func TestSQL(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: true})
	up, err := migrate.SQL(pg.Driver.Dialect(), "up")
	if err != nil || !strings.Contains(up, `CREATE TABLE "processed_event"`) || !strings.Contains(up, "-- 0001_idem_tables (up)") {
		t.Fatalf("up SQL:\n%s\n%v", up, err)
	}
	// The printed SQL is what a team applies with its own tool: it must run.
	pg.Exec(t, up)
	down, _ := migrate.SQL(pg.Driver.Dialect(), "down")
	pg.Exec(t, down)
	if _, err := migrate.SQL(pg.Driver.Dialect(), "sideways"); err == nil {
		t.Fatal("want an error for an unknown direction")
	}
}
