package main

import (
	"context"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOrderAPIAtRoot checks the shop's HTTP address: the carrier answers
// its paths, and the order API every other one, so that an unknown path or
// method is one of its problem documents, not the text of http.ServeMux.
func TestOrderAPIAtRoot(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	addr, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cfg := runConfig{
		Services: []string{"carrier", "order"}, DB: "sqlite:" + dir, ServiceDB: map[string]string{},
		Broker: embeddedBrokerURL(filepath.Join(dir, "nats")), HTTP: addr, Namespace: namespaceDefault,
		KeyLock: 10 * time.Second, RelayLease: 30 * time.Second, RelayWorkers: 1, Workers: 1, MaxConns: 4,
	}
	a, err := openApp(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.listener.Close() // never served
		closeApp(a)
	})
	const order = `{"customer_id":"c-7","lines":[{"product_id":"p-1","quantity":"2.000"}]}`
	for _, c := range []struct {
		method, path, body string
		status             int
		contentType, allow string
	}{
		{http.MethodGet, "/", "", 404, "application/problem+json", ""},
		{http.MethodGet, "/nope", "", 404, "application/problem+json", ""},
		{http.MethodGet, "/orders", "", 405, "application/problem+json", "POST"},
		{http.MethodDelete, "/orders/x", "", 405, "application/problem+json", "GET, HEAD"},
		{http.MethodGet, "/orders/x/cancel", "", 405, "application/problem+json", "POST"},
		{http.MethodPost, "/orders", order, 201, "application/json", ""},
		{http.MethodGet, "/carrier/stats", "", 200, "application/json", ""},
	} {
		req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		a.server.Handler.ServeHTTP(rec, req)
		if rec.Code != c.status || rec.Header().Get("Content-Type") != c.contentType || rec.Header().Get("Allow") != c.allow {
			t.Errorf("%s %s: %d %q Allow %q, want %d %q Allow %q: %s", c.method, c.path,
				rec.Code, rec.Header().Get("Content-Type"), rec.Header().Get("Allow"), c.status, c.contentType, c.allow, rec.Body)
		}
	}
}
