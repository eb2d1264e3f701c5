package binlog_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testtls"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/relay/binlog"
	"github.com/idem-go/idem/relay/internal/logengine/logenginetest"
)

// TestTLS runs the relay against a MariaDB server of the test's own whose
// user must present a client certificate (REQUIRE X509), so that neither
// the relay's SQL connections nor its replication connection get in
// without TLS: with the URL's sslmode=verify-full, sslrootcert, sslcert and
// sslkey, and then with Config.TLS on a URL without them, the rows written
// into the outbox are relayed. A URL trusting another CA, or without the
// client certificate, does not start; nor does tls=preferred, which would
// fall back to plain text.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := testtls.New(t)
	srv := testdb.StartMariaDBWith(t, testdb.MariaDBOptions{TLS: pki, Conf: testdb.SharedBinlog})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	drv, err := mysql.OpenURL(ctx, srv.URL, mysql.URLOptions{Database: "idem_tls"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.DB().Close() })
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		t.Fatal(err)
	}
	db := &testdb.SQLDB{URL: dbURL(t, srv.URL, "idem_tls"), Name: "idem_tls", DB: drv.DB(), Driver: drv}

	pub := memory.New()
	r := start(t, db, pub, fastConfig(t))
	eventually(t, "the relay streaming the binlog", func() bool { return r.Stats().Streaming })
	want := add(t, db, "url", 1, 5)
	logenginetest.CheckFirstOrder(t, waitLen(t, pub, len(want)), want)
	stop(t, r)

	plain := testtls.SetQuery(t, db.URL, "sslmode", "", "sslrootcert", "", "sslcert", "", "sslkey", "")
	cfg := fastConfig(t)
	cfg.TLS = pki.ClientConfig(t, true)
	pub = memory.New()
	r = start(t, &testdb.SQLDB{URL: plain}, pub, cfg)
	eventually(t, "the relay streaming the binlog", func() bool { return r.Stats().Streaming })
	more := add(t, db, "config", 1, 5)
	logenginetest.CheckFirstOrder(t, waitLen(t, pub, len(more)), more)

	for _, c := range []struct {
		what, url, want string
	}{
		{"another CA", testtls.SetQuery(t, db.URL, "sslrootcert", testtls.New(t).CA), "certificate signed by unknown authority"},
		{"no client certificate", testtls.SetQuery(t, db.URL, "sslcert", "", "sslkey", ""), "Access denied for user 'idem'"},
		{"tls=preferred", testtls.SetQuery(t, plain, "tls", "preferred"), "falls back to plain text"},
	} {
		r, err := binlog.New(c.url, memory.New(), fastConfig(t))
		if err == nil {
			sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
			err = r.Start(sctx)
			scancel()
			if err == nil {
				stop(t, r)
			}
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.what, err, c.want)
		}
	}
}

// dbURL returns rawURL with database name.
func dbURL(t *testing.T, rawURL, name string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}
