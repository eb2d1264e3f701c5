package idempotency_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/migrate"
)

// An order API whose POST /orders runs in one transaction with its
// Idempotency-Key: the key's claim, the order and the response to replay
// commit together, once per order. A retry gets the first response; an
// order refused (400) leaves no key, and its corrected retry runs.
func ExampleKeys_TxHandler() {
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
	placeOrder := func(ctx context.Context, tx *sql.Tx, r *http.Request) (idempotency.Response, error) {
		body, _ := io.ReadAll(r.Body)
		if !json.Valid(body) {
			// Not 2xx: rolled back with the key, sent, not stored.
			return idempotency.Response{Status: http.StatusBadRequest, Body: []byte("send JSON\n")}, nil
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO orders (body) VALUES (?)`, string(body))
		if err != nil {
			return idempotency.Response{}, err // 500, rolled back
		}
		id, _ := res.LastInsertId()
		out, _ := json.Marshal(map[string]int64{"id": id})
		// Stored with the key and committed with the order.
		return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: out}, nil
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", keys.TxHandler(placeOrder))
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
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.TrimSpace(string(b)))
	}
	send("order-1", `{"sku":"p-1"`)  // refused
	send("order-2", `{"sku":"p-1"}`) // placed
	send("order-2", `{"sku":"p-1"}`) // a retry after a timeout
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 400 replayed="" send JSON
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
	// orders: 1
}
