package mysql_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testtls"
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

// ParseURL turns sslmode, sslrootcert, sslcert and sslkey into the
// driver's TLS configuration, and sends none of them to the server.
func TestParseURLTLS(t *testing.T) {
	pki := testtls.New(t)
	base := "mysql://u:s3cret@db.example:3306/shop"
	files := "sslrootcert=" + pki.CA + "&sslcert=" + pki.ClientCert + "&sslkey=" + pki.ClientKey
	for _, c := range []struct {
		query string
		// want: "" (no TLS), "full" (chain and name), "chain" (chain
		// only), "none" (encrypted, nothing verified)
		want  string
		certs int
	}{
		{"", "", 0},
		{"sslmode=disable", "", 0},
		{"sslmode=verify-full&" + files, "full", 1},
		{"sslrootcert=" + pki.CA, "full", 0},
		{"sslmode=verify-ca&sslrootcert=" + pki.CA, "chain", 0},
		{"sslmode=require&sslrootcert=" + pki.CA, "chain", 0},
		{"sslmode=require&sslcert=" + pki.ClientCert + "&sslkey=" + pki.ClientKey, "none", 1},
		{"sslmode=verify-full", "full", 0},
	} {
		cfg, err := mysql.ParseURL(base + "?" + c.query)
		if err != nil {
			t.Errorf("%s: %v", c.query, err)
			continue
		}
		for _, k := range []string{"sslmode", "sslrootcert", "sslcert", "sslkey"} {
			if _, ok := cfg.Params[k]; ok {
				t.Errorf("%s: %s would be sent to the server", c.query, k)
			}
		}
		got := ""
		switch tc := cfg.TLS; {
		case tc == nil:
		case !tc.InsecureSkipVerify && tc.ServerName == "db.example":
			got = "full"
		case tc.InsecureSkipVerify && tc.VerifyConnection != nil:
			got = "chain"
		case tc.InsecureSkipVerify:
			got = "none"
		default:
			got = fmt.Sprintf("%+v", tc)
		}
		if got != c.want || (cfg.TLS != nil && len(cfg.TLS.Certificates) != c.certs) {
			t.Errorf("%s: TLS %q, want %q with %d client certificates", c.query, got, c.want, c.certs)
		}
	}
	for _, c := range []struct{ query, want string }{
		{"sslmode=prefer", `sslmode="prefer": want disable, require, verify-ca or verify-full`},
		{"sslmode=on", `sslmode="on"`},
		{"tls=true&sslmode=verify-full", "tls=true and the ssl parameters: give one or the other"},
		{"sslmode=disable&sslrootcert=" + pki.CA, "sslmode=disable with sslrootcert"},
		{"sslcert=" + pki.ClientCert, "sslcert and sslkey go together"},
		{"sslrootcert=/nonexistent/ca.pem", "sslrootcert: open /nonexistent/ca.pem"},
	} {
		_, err := mysql.ParseURL(base + "?" + c.query)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "idem: mysql: URL: ") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: %v, want an error with %q", c.query, err, c.want)
		}
	}

	// DSN registers the configuration under a name its tls parameter gives.
	dsn, err := mysql.DSN(base + "?sslmode=verify-full&" + files)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil || !strings.HasPrefix(cfg.TLSConfig, "idem-") || cfg.TLS == nil || cfg.TLS.RootCAs == nil ||
		cfg.TLS.ServerName != "db.example" || len(cfg.TLS.Certificates) != 1 || strings.Contains(dsn, "ssl") {
		t.Errorf("DSN %s: %+v, %v", dsn, cfg, err)
	}
}
