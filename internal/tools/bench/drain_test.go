package main

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
)

// TestBenchDrain runs "bench drain" small on PostgreSQL, MariaDB and
// SQLite: every drain reports, each database has its ratio, and the
// scratch schema, database and file are gone afterwards.
func TestBenchDrain(t *testing.T) {
	t.Parallel()
	pgURL, mariaURL, dir := testdb.PostgresURL(t), testdb.MariaDBURL(t), t.TempDir()
	code, out, errOut := runBench(t, nil, "drain", "--drain-db", pgURL, "--drain-db", mariaURL, "--drain-db", "sqlite:"+dir,
		"--rows", "600", "--drain-aggregates", "6,60", "--runs", "2")
	if code != 0 {
		t.Fatalf("bench drain = %d\n%s%s", code, out, errOut)
	}
	if errOut != "" {
		t.Logf("standard error:\n%s", errOut)
	}
	for _, want := range []string{`600 rows over 6,60 aggregates`, `(?m)^  run 2 sqlite +6 agg: \d+ \[.*\]  60 agg: `,
		`(?m)^  postgres +6 aggregates: +\d+ events/s`, `(?m)^  mysql +60 aggregates: .*takeovers 0, released 0, lost marks 0`,
		`(?m)^  postgres 60 / 6 aggregates: [0-9.]+ of the medians \(per run [0-9.]+, [0-9.]+\)`,
		`(?m)^  mysql +60 / 6 aggregates: `, `(?m)^  sqlite +60 / 6 aggregates: `} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("the output does not match %q:\n%s", want, out)
		}
	}
	name := strings.Fields(out[strings.Index(out, "scratch ")+len("scratch "):])[0]
	if !strings.HasPrefix(name, "idem_bench_drain_") {
		t.Fatalf("scratch name %q", name)
	}
	ctx := context.Background()
	pg := testdb.NewPostgres(t)
	var n int
	if err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("scratch schema %s left on PostgreSQL", name)
	}
	db, err := mysql.Open(mariaURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("scratch database %s left on MariaDB", name)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("files left in the SQLite directory: %v", left)
	}
}

func TestBenchDrainUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"drain"}, "no database: pass --drain-db"},
		{[]string{"drain", "--db", "sqlite:x", "--drain-aggregates", "10,x"}, "--drain-aggregates"},
		{[]string{"drain", "--db", "sqlite:x", "--runs", "0"}, "must be positive"},
	} {
		code, _, errOut := runBench(t, nil, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("bench %q = %d %q, want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	code, out, _ := runBench(t, nil, "help")
	for _, want := range []string{"bench drain [--drain-db URL]", "-drain-aggregates", "-drain-timeout", "(bench drain)"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("help = %d, want %q in\n%s", code, want, out)
		}
	}
}
