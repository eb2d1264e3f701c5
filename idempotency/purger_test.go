package idempotency_test

import (
	"context"
	"database/sql"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// TestPurger: a started purger deletes expired keys at once and then every
// interval, leaves the others, and stops once, however often Stop is
// called.
func TestPurger(t *testing.T) {
	t.Parallel()
	s := testdb.NewSQLite(t)
	db := testDB[*sql.Tx]{drv: s.Driver, dialect: "sqlite"}
	db.exec(t, widgetTable)
	var clk clock
	app := newWidgets(t, db, idempotency.Config{TTL: time.Hour, PurgeInterval: 20 * time.Millisecond, Now: clk.now})
	url := app.serve(t)
	for _, k := range []string{"k-1", "k-2"} {
		if r := post(t, url, k, bodyA); r.status != http.StatusCreated {
			t.Fatalf("%s: %v", k, r)
		}
	}
	p := app.keys.NewPurger()
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Hour)
	if r := post(t, url, "k-3", bodyA); r.status != http.StatusCreated {
		t.Fatalf("k-3: %v", r)
	}
	testsvc.WaitFor(t, 10*time.Second, "expired keys purged", func() bool { return s.Count(t, "idempotent_request") == 1 })
	if n := s.Count(t, "idempotent_request WHERE idem_key = 'k-3'"); n != 1 {
		t.Fatal("a key not expired was purged")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	if err := p.Start(context.Background()); err == nil {
		t.Fatal("a stopped purger started again")
	}
}
