package mysql_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
)

// OpenURL with a database creates it and uses it instead of the URL's, and
// opening it again finds it.
func TestOpenURLDatabase(t *testing.T) {
	ctx := context.Background()
	url := testdb.MariaDBURL(t)
	name := "idem_t_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	for range 2 {
		d, err := mysql.OpenURL(ctx, url, mysql.URLOptions{Database: name, MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		var current string
		if err := d.DB().QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&current); err != nil || current != name {
			t.Errorf("database %q, %v; want %s", current, err, name)
		}
		if s := d.Dialect().Tables().Schema; s != name {
			t.Errorf("tables in %q, want %s", s, name)
		}
		if n := d.DB().Stats().MaxOpenConnections; n != 2 {
			t.Errorf("%d connections at most, want 2", n)
		}
		_ = d.DB().Close()
	}
	d, err := mysql.OpenURL(ctx, url, mysql.URLOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DB().Close()
	if _, err := d.DB().ExecContext(ctx, "DROP DATABASE "+mysql.QuoteIdent(name)); err != nil {
		t.Fatal(err)
	}
}

func TestOpenURLErrors(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		url  string
		o    mysql.URLOptions
		want string
	}{
		{"mysql://u:s3cret@127.0.0.1:1/db?timeout=2s", mysql.URLOptions{}, "idem: mysql: connect: "},
		{"mysql://u:s3cret@127.0.0.1:1/db?timeout=2s", mysql.URLOptions{Database: "d"}, "idem: mysql: create database d: "},
		{"mysql://u:s3cret@h/%zz", mysql.URLOptions{Database: "d"}, "idem: mysql: URL: "},
		{"postgres://u:s3cret@h/db", mysql.URLOptions{}, "idem: mysql: URL scheme"},
	} {
		d, err := mysql.OpenURL(ctx, c.url, c.o)
		if err == nil {
			_ = d.DB().Close()
		}
		if err == nil || !strings.HasPrefix(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("OpenURL(%q, %+v): %v; want an error starting with %q, without the password", c.url, c.o, err, c.want)
		}
	}
}
