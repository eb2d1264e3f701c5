package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/driver/sqlite"
)

// TestMigrateSQLWithoutDatabase prints each dialect's SQL with --dialect and
// no database URL anywhere.
func TestMigrateSQLWithoutDatabase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dialect", "postgres"}, `CREATE TABLE "outbox"`},
		{[]string{"--dialect", "postgresql", "--schema", "app"}, `CREATE TABLE "app"."processed_event"`},
		{[]string{"--dialect", "mysql"}, "CREATE TABLE `failed_message`"},
		{[]string{"--dialect", "mariadb", "--schema", "shop"}, "CREATE TABLE `shop`.`outbox`"},
		{[]string{"--dialect", "sqlite"}, `CREATE TABLE "delivery_attempt"`},
		{[]string{"--dialect", "sqlite", "--down"}, `DROP TABLE "outbox"`},
	} {
		code, out, errOut := idem(t, nil, "", append([]string{"migrate", "sql"}, tc.args...)...)
		if code != 0 || !strings.Contains(out, tc.want) {
			t.Errorf("migrate sql %v = %d, want %q in\n%s%s", tc.args, code, tc.want, out, errOut)
		}
	}
	// IDEM_SCHEMA as for the other commands.
	code, out, _ := idem(t, map[string]string{"IDEM_SCHEMA": "app"}, "", "migrate", "sql", "--dialect", "postgres")
	if code != 0 || !strings.Contains(out, `CREATE TABLE "app"."outbox"`) {
		t.Errorf("IDEM_SCHEMA=app migrate sql --dialect postgres = %d\n%s", code, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "sql"}, "pass --dialect postgres|mysql|sqlite"},
		{[]string{"migrate", "sql", "--dialect", "oracle"}, `dialect "oracle": want postgres, mysql, sqlite`},
		{[]string{"migrate", "up", "--dialect", "sqlite"}, "--dialect is for migrate sql"},
	} {
		code, _, errOut := idem(t, nil, "", tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("idem %v = %d %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestMigrateSQLRuns applies the SQLite SQL that migrate sql prints, as a
// team with its own migration tool would, then the down SQL.
func TestMigrateSQLRuns(t *testing.T) {
	t.Parallel()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx := context.Background()
	tables := func() []string {
		rows, err := db.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var names []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			names = append(names, n)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return names
	}
	for _, dir := range []string{"up", "down"} {
		args := []string{"migrate", "sql", "--dialect", "sqlite"}
		if dir == "down" {
			args = append(args, "--down")
		}
		code, out, errOut := idem(t, nil, "", args...)
		if code != 0 {
			t.Fatalf("idem %v = %d %s", args, code, errOut)
		}
		if _, err := db.ExecContext(ctx, out); err != nil {
			t.Fatalf("the %s SQL does not run: %v\n%s", dir, err, out)
		}
		got := strings.Join(tables(), " ")
		if dir == "up" && got != "consumer_member consumer_partition consumer_pause delivery_attempt failed_message idempotent_request outbox processed_event" {
			t.Fatalf("tables after the up SQL: %s", got)
		}
		if dir == "down" && got != "" {
			t.Fatalf("tables after the down SQL: %s", got)
		}
	}
}
