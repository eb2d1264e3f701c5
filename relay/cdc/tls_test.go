package cdc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testtls"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/cdc"
)

// TestTLS runs the relay against a PostgreSQL server of the test's own that
// takes TCP connections, replication ones included, over TLS with a client
// certificate only: with the URL's sslmode=verify-full, sslrootcert,
// sslcert and sslkey, its pool and its replication connection (pglogrepl)
// are encrypted and an event written into the outbox is published. The
// relay does not start when the URL trusts another CA (the client's
// refusal) or gives no client certificate (the server's).
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := testtls.New(t)
	srv := testdb.StartServerWith(t, testdb.ServerOptions{TLS: pki})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	drv := postgres.NewPgx(pool)
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(t)
	cfg.Tables.Schema = "public"

	other := testtls.New(t)
	for _, c := range []struct {
		what, url, want string
	}{
		{"another CA", testtls.SetQuery(t, srv.URL, "sslrootcert", other.CA), "certificate signed by unknown authority"},
		{"no client certificate", testtls.SetQuery(t, srv.URL, "sslcert", "", "sslkey", ""), "connection requires a valid client certificate"},
	} {
		r, err := cdc.New(c.url, memory.New(), cfg)
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

	pub := memory.New()
	r, err := cdc.New(srv.URL, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatalf("start over TLS: %v", err)
	}
	t.Cleanup(func() { stop(t, r) })
	eventually(t, 30*time.Second, "the relay streaming", func() bool { return r.Stats().Streaming })
	ev := event(t, "1", 1)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.NewWriter(drv).Add(ctx, tx, ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if msgs := waitLen(t, pub, 1, 30*time.Second); msgs[0].EventID != ev.ID {
		t.Errorf("published %s, want %s", msgs[0].EventID, ev.ID)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_ssl s ON s.pid = r.pid
		WHERE s.ssl`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d encrypted replication connections, %v; want the relay's", n, err)
	}
}
