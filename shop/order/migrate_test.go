package order

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/shop/internal/shoptest"
	"github.com/idem-go/idem/shop/store"
)

// TestKeysMovedToIdem upgrades an order database whose Idempotency-Keys
// are in the service's own table (version 1) to idem's idempotent_request
// (version 2): a request answered before the upgrade is replayed after it,
// a request running during it still holds its key, an expired key is
// forgotten, and the old table is gone.
func TestKeysMovedToIdem(t *testing.T) {
	t.Parallel()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "order_m_" + hex.EncodeToString(b)
	for dialect, open := range map[string]func(t *testing.T) *store.DB{
		store.SQLite: func(t *testing.T) *store.DB {
			db, err := store.Open(context.Background(), "order", "sqlite:"+filepath.Join(t.TempDir(), "db"), schema, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(db.Close)
			return db
		},
		store.Postgres: func(t *testing.T) *store.DB {
			db, err := store.Open(context.Background(), "order", shoptest.PostgresURL(t), schema, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_, _ = db.SQL.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
				db.Close()
			})
			return db
		},
		store.MySQL: func(t *testing.T) *store.DB {
			db, err := store.Open(context.Background(), "order", shoptest.MariaDBURL(t), schema, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_, _ = db.SQL.Exec("DROP DATABASE `" + schema + "`")
				db.Close()
			})
			return db
		},
	} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			db := open(t)
			ctx := context.Background()
			if err := db.Migrate(ctx, store.Migrations{dialect: Migrations()[dialect][:1]}, nil); err != nil {
				t.Fatal(err)
			}
			// Keys as version 1 of the service wrote them.
			now := time.Now().UTC()
			hash := idempotency.Fingerprint(http.MethodPost, "/orders", []byte(body1))
			const answered = `{"id":"from-before-the-upgrade"}`
			for _, k := range []struct {
				key, state      string
				status          any
				body            any
				locked, expires time.Time
			}{
				{"old-done", "done", 201, answered, now, now.Add(time.Hour)},
				{"old-running", "processing", nil, nil, now.Add(time.Hour), now.Add(time.Hour)},
				{"old-expired", "done", 201, answered, now.Add(-time.Hour), now.Add(-time.Minute)},
			} {
				if _, err := db.SQL.ExecContext(ctx, db.Q(`INSERT INTO idempotency_key (idem_key, request_hash, state, owner, response_status, response_body, locked_until, expires_at, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`), k.key, hash, k.state, uuid.NewString(), k.status, k.body, k.locked, k.expires, now); err != nil {
					t.Fatal(err)
				}
			}
			if err := db.Migrate(ctx, Migrations(), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := db.SQL.ExecContext(ctx, `SELECT count(*) FROM idempotency_key`); err == nil {
				t.Error("idempotency_key is still there after the upgrade")
			}
			s, err := New(db, Config{})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(s.Handler())
			t.Cleanup(srv.Close)
			if r := post(t, srv.URL, "old-done", body1); r.status != http.StatusCreated || !r.replayed || r.body != answered {
				t.Errorf("retry of a request answered before the upgrade: %d replayed=%v %s, want its response", r.status, r.replayed, r.body)
			}
			if r := post(t, srv.URL, "old-done", body2); r.status != http.StatusUnprocessableEntity {
				t.Errorf("another body with a key of before the upgrade: %d, want 422", r.status)
			}
			if r := post(t, srv.URL, "old-running", body1); r.status != http.StatusConflict {
				t.Errorf("retry of a request running during the upgrade: %d, want 409", r.status)
			}
			if r := post(t, srv.URL, "old-expired", body2); r.status != http.StatusCreated || r.replayed {
				t.Errorf("a key expired before the upgrade: %d replayed=%v, want a new order", r.status, r.replayed)
			}
			if n := countOrders(t, db); n != 1 {
				t.Errorf("%d orders, want 1", n)
			}
		})
	}
}
