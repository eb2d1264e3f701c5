package order

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/shop/internal/shoptest"
	"github.com/idem-go/idem/shop/store"
)

// TestDatabaseAwayLogsOncePerCause: while the order service's database
// cannot be reached, each request is answered 5xx, and the log holds a line
// per cause, not per request; when the database is back, one line says that
// requests recovered, with how many failed.
func TestDatabaseAwayLogsOncePerCause(t *testing.T) {
	ctx := context.Background()
	u, err := url.Parse(shoptest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, u.Host)
	u.Host = p.addr
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "order_t_" + hex.EncodeToString(b)
	db, err := store.Open(ctx, "order", u.String(), schema, store.Options{MaxConns: 4})
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
	var logs lockedBuffer
	// An interval longer than the test: no summary line, whatever the
	// machine's speed.
	s, err := New(db, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), ErrorLogInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)

	placed := post(t, srv.URL, "key-0", body1)
	if placed.status != http.StatusCreated {
		t.Fatalf("order not placed: %d %s", placed.status, placed.body)
	}
	send := func(method, path, key, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type")
	}

	p.stop()
	const requests = 200
	for i := range requests {
		var status int
		var ct string
		switch i % 3 {
		case 0:
			status, ct = send(http.MethodGet, "/orders/"+placed.order.ID, "", "")
		case 1:
			status, ct = send(http.MethodPost, "/orders/"+placed.order.ID+"/cancel", "", "")
		default:
			status, ct = send(http.MethodPost, "/orders", fmt.Sprintf("key-%d", i), body1)
		}
		if status < 500 || ct != "application/problem+json" {
			t.Fatalf("request %d with the database away: %d %s, want 5xx application/problem+json", i, status, ct)
		}
	}
	away := logs.String()
	errorLines := strings.Count(away, "level=ERROR")
	if errorLines == 0 || errorLines > 6 {
		t.Errorf("%d ERROR lines for %d failed requests, want 1 to 6 (one per cause):\n%s", errorLines, requests, away)
	}
	if strings.Contains(away, "repeated=") || strings.Contains(away, "recovered") {
		t.Errorf("a summary or recovered line within the interval, with the database away:\n%s", away)
	}

	// The database is back: the first request that succeeds logs the
	// recovery, with every failure counted.
	p.start()
	failures := requests
	deadline := time.Now().Add(30 * time.Second)
	for {
		status, _ := send(http.MethodGet, "/orders/"+placed.order.ID, "", "")
		if status == http.StatusOK {
			break
		}
		failures++
		if time.Now().After(deadline) {
			t.Fatalf("GET /orders/%s still answers %d 30s after the database came back", placed.order.ID, status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := post(t, srv.URL, "key-after", body2); r.status != http.StatusCreated {
		t.Fatalf("order after the database came back: %d %s", r.status, r.body)
	}
	send(http.MethodGet, "/orders/"+placed.order.ID, "", "")
	after := strings.TrimPrefix(logs.String(), away)
	m := regexp.MustCompile(`level=INFO msg="order requests recovered" service=order failed_for=\S+ failures=(\d+)\n`).FindAllStringSubmatch(after, -1)
	if len(m) != 1 {
		t.Fatalf("%d recovered lines, want 1:\n%s", len(m), after)
	}
	if n, _ := strconv.Atoi(m[0][1]); n != failures {
		t.Errorf("recovered line counts %d failures, want %d", n, failures)
	}
	if strings.Contains(after, "level=ERROR") {
		t.Errorf("ERROR lines once the database is back:\n%s", after)
	}
}

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proxy forwards TCP connections to a server; stopped, it closes them and
// refuses new ones ("connection refused"), as a server that went away.
type proxy struct {
	t      *testing.T
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	p := &proxy{t: t, target: target, addr: "127.0.0.1:0", conns: map[net.Conn]struct{}{}}
	p.start()
	t.Cleanup(p.stop)
	return p
}

// start listens on the proxy's address (a free port the first time).
func (p *proxy) start() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.ln, p.addr = ln, ln.Addr().String()
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // stopped
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			if !p.track(c, s) {
				return
			}
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
			}
			p.wg.Go(func() { pipe(s, c) })
			p.wg.Go(func() { pipe(c, s) })
		}
	})
}

// track records the connections of a client, unless the proxy was stopped.
func (p *proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// stop closes the listener and every connection, and waits for the proxy's
// goroutines.
func (p *proxy) stop() {
	p.mu.Lock()
	if p.ln != nil {
		if err := p.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			p.t.Error(err)
		}
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
	p.mu.Unlock()
	p.wg.Wait()
}
