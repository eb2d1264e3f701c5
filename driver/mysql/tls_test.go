package mysql_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/internal/testtls"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// TestTLS runs the dialect over TLS against a MariaDB server of the test's
// own whose user must present a client certificate (REQUIRE X509): the
// URL's sslmode=verify-full, sslrootcert, sslcert and sslkey reach it, and
// an event written through the outbox is published by the polling relay.
// The client refuses a server whose certificate another CA signed, and the
// server refuses a client without a certificate.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := testtls.New(t)
	srv := testdb.StartMariaDBWith(t, testdb.MariaDBOptions{TLS: pki})
	ctx := testsvc.Ctx(t, 2*time.Minute)

	drv, err := mysql.OpenURL(ctx, srv.URL, mysql.URLOptions{Database: "idem_tls"})
	if err != nil {
		t.Fatalf("open over TLS: %v", err)
	}
	t.Cleanup(func() { _ = drv.DB().Close() })
	var name, cipher string
	if err := drv.DB().QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher); err != nil || cipher == "" {
		t.Fatalf("Ssl_cipher %q, %v: the session is not encrypted", cipher, err)
	}
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		t.Fatal(err)
	}
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
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	pub := memory.New()
	r, err := relay.New[*sql.Tx](drv, pub, relay.Config{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, r)
	testsvc.WaitFor(t, time.Minute, "the event published over TLS", func() bool {
		ms := pub.Messages()
		return len(ms) == 1 && ms[0].EventID == ev.ID
	})

	other := testtls.New(t)
	for _, c := range []struct {
		what, url, want string
	}{
		{"another CA", testtls.SetQuery(t, srv.URL, "sslrootcert", other.CA), "certificate signed by unknown authority"},
		{"another CA, verify-ca", testtls.SetQuery(t, srv.URL, "sslrootcert", other.CA, "sslmode", "verify-ca"), "certificate signed by unknown authority"},
		{"no client certificate", testtls.SetQuery(t, srv.URL, "sslcert", "", "sslkey", ""), "Error 1045 (28000): Access denied"},
		{"no TLS", testtls.SetQuery(t, srv.URL, "sslmode", "", "sslrootcert", "", "sslcert", "", "sslkey", ""), "Error 1045 (28000): Access denied"},
	} {
		d, err := mysql.OpenURL(ctx, c.url, mysql.URLOptions{})
		if err == nil {
			_ = d.DB().Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.what, err, c.want)
		}
	}
}
