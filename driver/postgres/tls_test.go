package postgres_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the pgx driver of database/sql

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/internal/testtls"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// TestTLS runs both connection APIs over TLS against a PostgreSQL server
// of the test's own that takes TCP connections over TLS with a client
// certificate only: the URL's sslmode=verify-full, sslrootcert, sslcert and
// sslkey reach it through pgx (OpenURL, NewPgx) and through database/sql
// on the pgx stdlib driver (NewSQL), and on each an event written through
// the outbox is published by the polling relay. The client refuses a server
// whose certificate another CA signed, and the server refuses a client
// without a certificate.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := testtls.New(t)
	srv := testdb.StartServerWith(t, testdb.ServerOptions{TLS: pki})
	ctx := testsvc.Ctx(t, 2*time.Minute)

	pgxDrv, err := postgres.OpenURL(ctx, srv.URL, postgres.URLOptions{})
	if err != nil {
		t.Fatalf("pgx over TLS: %v", err)
	}
	t.Cleanup(pgxDrv.Pgx().Close)
	var ssl bool
	if err := pgxDrv.Pgx().QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Fatalf("pg_stat_ssl.ssl %v, %v: the session is not encrypted", ssl, err)
	}
	if _, err := migrate.New(pgxDrv).Up(ctx); err != nil {
		t.Fatal(err)
	}
	relayOne(ctx, t, pgxDrv)

	db, err := sql.Open("pgx", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	relayOne(ctx, t, postgres.NewSQL(db))

	other := testtls.New(t)
	for _, c := range []struct {
		what, url, want string
	}{
		{"another CA", testtls.SetQuery(t, srv.URL, "sslrootcert", other.CA), "certificate signed by unknown authority"},
		{"another CA, verify-ca", testtls.SetQuery(t, srv.URL, "sslrootcert", other.CA, "sslmode", "verify-ca"), "certificate signed by unknown authority"},
		{"no client certificate", testtls.SetQuery(t, srv.URL, "sslcert", "", "sslkey", ""), "connection requires a valid client certificate"},
		{"no TLS", testtls.SetQuery(t, srv.URL, "sslmode", "disable", "sslrootcert", "", "sslcert", "", "sslkey", ""), "no encryption"},
	} {
		d, err := postgres.OpenURL(ctx, c.url, postgres.URLOptions{})
		if err == nil {
			d.Pgx().Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pgx, %s: %v, want an error saying %q", c.what, err, c.want)
		}
		db, err := sql.Open("pgx", c.url)
		if err != nil {
			t.Fatal(err)
		}
		err = db.PingContext(ctx)
		_ = db.Close()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("database/sql, %s: %v, want an error saying %q", c.what, err, c.want)
		}
	}
}

// relayOne writes an event through drv's outbox and waits until a polling
// relay on drv publishes it.
func relayOne[TTx any](ctx context.Context, t *testing.T, drv driver.Driver[TTx]) {
	t.Helper()
	ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]int{"total": 1})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.NewWriter(drv).Add(ctx, tx, ev); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	pub := memory.New()
	r, err := relay.New(drv, pub, relay.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer testsvc.Start(t, r)()
	testsvc.WaitFor(t, time.Minute, "the event published over TLS", func() bool {
		ms := pub.Messages()
		return len(ms) == 1 && ms[0].EventID == ev.ID
	})
}
