package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/migrate"
)

// An order API whose POST /orders writes the order and completes its
// Idempotency-Key in one transaction: a retry gets the first response, and
// the key used with another order is 422.
func ExampleKeys_Middleware() {
	dir, _ := os.MkdirTemp("", "idempotency-example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "shop.db"))
	defer db.Close()
	drv := sqlite.New(db)
	ctx := context.Background()
	if _, err := migrate.New(drv).Up(ctx); err != nil { // creates idempotent_request
		fmt.Println(err)
		return
	}
	_, _ = db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, body TEXT NOT NULL)`)

	keys, err := idempotency.New(drv, idempotency.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	placeOrder := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer tx.Rollback()
		res, err := tx.ExecContext(r.Context(), `INSERT INTO orders (body) VALUES (?)`, string(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		out, _ := json.Marshal(map[string]int64{"id": id})
		resp := idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: out}
		// The key's response commits with the order, or not at all.
		if err := keys.Complete(r.Context(), tx, idempotency.ClaimFrom(r.Context()), resp); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		resp.Send(w)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", keys.Middleware(http.HandlerFunc(placeOrder)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 400 {
			b = []byte(resp.Header.Get("Content-Type"))
		}
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.TrimSpace(string(b)))
	}
	send("order-7f3a", `{"sku":"p-1","qty":2}`)
	send("order-7f3a", `{"sku":"p-1","qty":2}`) // a retry after a timeout
	send("order-7f3a", `{"sku":"p-1","qty":3}`) // another order, same key
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
	// 422 replayed="" application/problem+json
	// orders: 1
}

// A pickup requested from a carrier that loses its answer: Do looks the
// pickup up by reference instead of asking for a second one.
func ExampleDo() {
	var created, requests atomic.Int32
	carrier := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.Method == http.MethodGet { // lookup by reference
			fmt.Fprint(w, `[{"id":"pk-1","reference":"42"}]`)
			return
		}
		created.Add(1) // the work is done, once for the key...
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close() // ...and the answer is lost
	}))
	defer carrier.Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	type pickup struct{ ID, Reference string }
	p, err := idempotency.Do(context.Background(), idempotency.Call[pickup]{
		Key: idempotency.StableKey("shipment", "42", "initial"),
		Send: func(ctx context.Context, key string) (pickup, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, carrier.URL+"/pickups", strings.NewReader(`{"reference":"42"}`))
			req.Header.Set("Idempotency-Key", key)
			resp, err := client.Do(req)
			if err != nil {
				return pickup{}, idempotency.ClassifyTransport(ctx, err)
			}
			defer resp.Body.Close()
			var p pickup
			return p, json.NewDecoder(resp.Body).Decode(&p)
		},
		Lookup: func(ctx context.Context) (pickup, bool, error) {
			resp, err := client.Get(carrier.URL + "/pickups?reference=42")
			if err != nil {
				return pickup{}, false, idempotency.ClassifyTransport(ctx, err)
			}
			defer resp.Body.Close()
			var found []pickup
			if err := json.NewDecoder(resp.Body).Decode(&found); err != nil || len(found) == 0 {
				return pickup{}, false, err
			}
			return found[0], true, nil
		},
	})
	fmt.Println(p.ID, err, "created:", created.Load(), "requests:", requests.Load())
	// Output: pk-1 <nil> created: 1 requests: 2
}

func ExampleStableKey() {
	fmt.Println(idempotency.StableKey("shipment", "42", "initial"))
	fmt.Println(idempotency.StableKey("invoice", "42", "void-email"))
	// Output:
	// shipment:42:initial
	// invoice:42:void-email
}

func ExampleFingerprint() {
	a := idempotency.Fingerprint(http.MethodPost, "/orders", []byte(`{"qty":2}`))
	b := idempotency.Fingerprint(http.MethodPost, "/orders", []byte(`{ "qty": 2 }`))
	fmt.Println(len(a), a == b)
	// Output: 64 false
}
