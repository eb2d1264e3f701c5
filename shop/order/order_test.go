package order

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/shop/internal/shoptest"
	"github.com/idem-go/idem/shop/store"
)

func setup(t *testing.T, cfg Config) (*Service, *httptest.Server, *store.DB) {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "order_t_" + hex.EncodeToString(b)
	ctx := context.Background()
	db, err := store.Open(ctx, "order", shoptest.PostgresURL(t), schema, store.Options{MaxConns: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.SQL.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
		db.Close()
	})
	if err := db.Migrate(ctx, Migrations(), nil); err != nil {
		t.Fatal(err)
	}
	s, err := New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv, db
}

type response struct {
	status   int
	replayed bool
	body     string
	order    Order
}

func post(t *testing.T, url, key, body string) response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/orders", bytes.NewReader([]byte(body)))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return response{}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := response{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: string(raw)}
	_ = json.Unmarshal(raw, &r.order)
	return r
}

const body1 = `{"customer_id":"c-7","lines":[{"product_id":"p-1","quantity":"2.000"}]}`
const body2 = `{"customer_id":"c-8","lines":[{"product_id":"p-1","quantity":"1"}]}`

func countOrders(t *testing.T, db *store.DB) int64 {
	t.Helper()
	n, err := db.Count(context.Background(), `SELECT count(*) FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	_, srv, db := setup(t, Config{})
	r := post(t, srv.URL, "", body1)
	if r.status != http.StatusCreated || r.order.Status != StatusConfirmed || r.order.Fulfilment != FulfilmentAwaiting {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	if r.order.Lines[0].Quantity != "2.000" {
		t.Errorf("quantity %q", r.order.Lines[0].Quantity)
	}
	n, err := db.Count(context.Background(), `SELECT count(*) FROM outbox WHERE type = 'order.order.placed.v1' AND aggregateid = $1`, r.order.ID)
	if err != nil || n != 1 {
		t.Fatalf("outbox events for the order: %d, %v", n, err)
	}
	for _, bad := range []string{`{}`, `{"customer_id":"c","lines":[]}`, `{"customer_id":"c","lines":[{"product_id":"p","quantity":"-1"}]}`,
		`{"customer_id":"c","lines":[{"product_id":"p","quantity":"0.000"}]}`, `{"customer_id":"c","lines":[{"product_id":"p","quantity":2}]}`} {
		if r := post(t, srv.URL, "", bad); r.status != http.StatusBadRequest {
			t.Errorf("%s: got %d, want 400", bad, r.status)
		}
	}
	if countOrders(t, db) != 1 {
		t.Error("rejected requests wrote orders")
	}
}

func TestIdempotencyKeyReplayAndMismatch(t *testing.T) {
	t.Parallel()
	_, srv, db := setup(t, Config{})
	first := post(t, srv.URL, "key-1", body1)
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	again := post(t, srv.URL, "key-1", body1)
	if again.status != http.StatusCreated || !again.replayed || again.body != first.body {
		t.Fatalf("replay: %d replayed=%v %s", again.status, again.replayed, again.body)
	}
	other := post(t, srv.URL, "key-1", body2)
	if other.status != http.StatusUnprocessableEntity {
		t.Fatalf("another body with the same key: %d %s", other.status, other.body)
	}
	if n := countOrders(t, db); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
}

func TestIdempotencyKeyConflictWhileRunningThenTakeover(t *testing.T) {
	t.Parallel()
	s, srv, db := setup(t, Config{KeyLockTimeout: 300 * time.Millisecond})
	// A request with the key is running (or crashed before its commit).
	c, err := s.keys.Claim(context.Background(), idempotency.Request{Key: "key-2", Fingerprint: idempotency.Fingerprint(http.MethodPost, "/orders", []byte(body1))})
	if err != nil || c.Outcome != idempotency.Claimed {
		t.Fatalf("begin: %+v %v", c, err)
	}
	if r := post(t, srv.URL, "key-2", body1); r.status != http.StatusConflict {
		t.Fatalf("retry while running: %d %s", r.status, r.body)
	}
	// After the lock timeout, a retry takes the key over.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := post(t, srv.URL, "key-2", body1)
		if r.status == http.StatusCreated {
			break
		}
		if r.status != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("retry after the lock timeout: %d %s", r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The first request cannot complete any more.
	tx, err := db.SQL.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := s.keys.Complete(context.Background(), tx, c, idempotency.Response{Status: 201, Body: []byte("{}")}); !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("completion by the taken-over request: %v, want ErrClaimLost", err)
	}
	if n := countOrders(t, db); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
}

func TestIdempotencyKeyExpires(t *testing.T) {
	t.Parallel()
	s, srv, db := setup(t, Config{KeyTTL: 200 * time.Millisecond})
	if r := post(t, srv.URL, "key-3", body1); r.status != http.StatusCreated {
		t.Fatalf("first: %d", r.status)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := post(t, srv.URL, "key-3", body2)
		if r.status == http.StatusCreated && !r.replayed {
			break
		}
		if r.status != http.StatusUnprocessableEntity || time.Now().After(deadline) {
			t.Fatalf("after expiry: %d %s", r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := countOrders(t, db); n != 2 {
		t.Fatalf("%d orders, want 2", n)
	}
	// Purge removes expired keys.
	deadline = time.Now().Add(10 * time.Second)
	for {
		if _, err := s.keys.Purge(context.Background()); err != nil {
			t.Fatal(err)
		}
		n, err := db.Count(context.Background(), `SELECT count(*) FROM idempotent_request`)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys left after purge", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestIdempotencyKeyConcurrentIdenticalRequests(t *testing.T) {
	t.Parallel()
	_, srv, db := setup(t, Config{})
	const n = 200
	results := make([]response, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = post(t, srv.URL, "key-concurrent", body1)
		})
	}
	close(start)
	wg.Wait()
	var created, conflicts int
	var id string
	for _, r := range results {
		switch r.status {
		case http.StatusCreated:
			created++
			if id == "" {
				id = r.order.ID
			}
			if r.order.ID != id {
				t.Fatalf("two order ids: %s and %s", id, r.order.ID)
			}
		case http.StatusConflict:
			conflicts++
		default:
			t.Fatalf("unexpected answer %d %s", r.status, r.body)
		}
	}
	if created == 0 {
		t.Fatal("no request created the order")
	}
	if got := countOrders(t, db); got != 1 {
		t.Fatalf("%d orders, want 1", got)
	}
	t.Logf("%d created or replayed, %d conflicts", created, conflicts)
}
