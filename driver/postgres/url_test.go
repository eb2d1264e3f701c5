package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
)

// OpenURL with a schema creates it, puts it first on the search_path, and
// opening it again finds it.
func TestOpenURLSchema(t *testing.T) {
	ctx := context.Background()
	url := testdb.PostgresURL(t)
	schema := "idem_t_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	for range 2 {
		d, err := postgres.OpenURL(ctx, url, postgres.URLOptions{Schema: schema, MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		pool := d.Pgx()
		if n := pool.Config().MaxConns; n != 2 {
			t.Errorf("pool of %d connections, want 2", n)
		}
		var current string
		if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&current); err != nil || current != schema {
			t.Errorf("current schema %q, %v; want %s", current, err, schema)
		}
		// database/sql on the same pool.
		db := stdlib.OpenDBFromPool(pool)
		drv, err := postgres.NewSQLTables(db, d.Dialect().Tables())
		if err != nil || drv.Dialect().Name() != "postgres" {
			t.Errorf("NewSQLTables: %v", err)
		}
		_ = db.Close()
		pool.Close()
	}
	d, err := postgres.OpenURL(ctx, url, postgres.URLOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Pgx().Close()
	if _, err := d.Pgx().Exec(ctx, `DROP SCHEMA `+postgres.QuoteIdent(schema)+` CASCADE`); err != nil {
		t.Fatal(err)
	}
}

func TestOpenURLErrors(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		url, want string
	}{
		{"postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=2", "idem: postgres: connect: "},
		{"postgres://u:s3cret@127.0.0.1:5432/db?sslmode=nope", "idem: postgres: URL: "},
	} {
		d, err := postgres.OpenURL(ctx, c.url, postgres.URLOptions{})
		if err == nil {
			d.Pgx().Close()
		}
		if err == nil || !strings.HasPrefix(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("OpenURL(%q): %v; want an error starting with %q, without the password", c.url, err, c.want)
		}
	}
	_, err := postgres.OpenURL(ctx, "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=2", postgres.URLOptions{Schema: "s"})
	if err == nil || !strings.Contains(err.Error(), "create schema s") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("OpenURL with a schema on no server: %v; want an error naming the schema", err)
	}
}
