package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// TestRelayProcessOnSQLDialects runs "idem relay" as a process on MariaDB
// and on SQLite, publishing to RabbitMQ: the events committed before it
// started and those committed while it runs reach the broker, each
// aggregate's in order and none before its transaction was visible, every
// row is marked published, and a SIGTERM stops it cleanly.
func TestRelayProcessOnSQLDialects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		open func(t *testing.T) (*testdb.SQLDB, string)
	}{
		{"mariadb", func(t *testing.T) (*testdb.SQLDB, string) {
			db := testdb.NewMariaDB(t, testdb.Options{MaxConns: 8})
			return db, db.URL
		}},
		{"sqlite", func(t *testing.T) (*testdb.SQLDB, string) {
			db := testdb.NewSQLite(t)
			return db, "sqlite:" + db.URL
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, dbURL := tc.open(t)
			rb := newMariaRabbit(t, db)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()

			before, err := writeMariaLoad(ctx, db, "before", 4, 100, 5)
			if err != nil {
				t.Fatal(err)
			}
			p := startProc(t, "idem relay ("+tc.name+")", nil, "relay", "--db", dbURL, "--broker", rb.brokerURL(),
				"--metrics-addr", "", "--log-level", "debug")
			after, err := writeMariaLoad(ctx, db, "after", 4, 100, 5)
			if err != nil {
				t.Fatal(err)
			}
			all := append(before, after...)

			testsvc.WaitFor(t, 120*time.Second, fmt.Sprintf("%d events delivered", len(all)), func() bool {
				if p.exited() {
					t.Fatalf("%s exited:\n%s", p.name, tail(p.out.String(), 4000))
				}
				seen := map[uuid.UUID]bool{}
				for _, d := range rb.deliveries() {
					seen[d.id] = true
				}
				return len(seen) >= len(all)
			})
			testsvc.WaitFor(t, 30*time.Second, "every row marked published", func() bool {
				return db.Count(t, "outbox WHERE published_at IS NULL") == 0
			})
			if n := db.Count(t, "outbox WHERE published_at IS NOT NULL"); n != len(all) {
				t.Errorf("%d rows marked published, want %d", n, len(all))
			}
			checkDelivered(t, rb.deliveries(), all)
			p.stop(t)
			if out := p.out.String(); !strings.Contains(out, "relay stopped") {
				t.Errorf("%s did not log that it stopped:\n%s", p.name, tail(out, 4000))
			}
		})
	}
}
