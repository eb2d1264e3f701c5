package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// noKeepAlive leaves no idle connection behind for goleak.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := noKeepAlive.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// idem relay serves its metrics, fed by the relay's hooks, its health and,
// with --pprof, the Go profiles at --metrics-addr.
func TestRelayServesMetricsAndProfiles(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	ctx := context.Background()
	w := outbox.NewWriter(pg.Driver)
	const events = 5
	err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
		for i := range events {
			ev, err := idemmsg.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]int{"i": i})
			if err != nil {
				return err
			}
			if err := w.Add(ctx, tx, ev); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var received atomic.Int64
	broker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Messages []json.RawMessage }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		received.Add(int64(len(req.Messages)))
	}))
	defer broker.Close()

	addr := freeAddr(t)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		e := &env{stdout: io.Discard, stderr: io.Discard, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
		done <- run(rctx, e, []string{"relay", "--db", pg.URL, "--broker", broker.URL, "--metrics-addr", addr, "--pprof", "--poll-interval", "50ms"})
	}()
	defer func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("idem relay exited with %d", code)
		}
	}()

	var metrics string
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(metrics, fmt.Sprintf("\nidem_relay_published_total %d\n", events)) {
		if time.Now().After(deadline) {
			t.Fatalf("idem_relay_published_total never reached %d; last scrape:\n%s", events, metrics)
		}
		time.Sleep(20 * time.Millisecond)
		_, metrics = get(t, "http://"+addr+"/metrics")
	}
	if received.Load() < events {
		t.Errorf("the broker received %d messages, want %d", received.Load(), events)
	}
	for _, want := range []string{
		"\nidem_relay_inflight_publishes 0\n",
		"\nidem_relay_backlog_rows ",
		"\nidem_relay_commit_to_publish_seconds_count 5\n",
		"\nidem_relay_claim_duration_seconds_count ",
		"\nidem_relay_publish_duration_seconds_count ",
		"\nidem_relay_mark_duration_seconds_count ",
		"\ngo_goroutines ",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %q", strings.TrimSpace(want))
		}
	}
	for _, h := range []string{"claim", "publish", "mark"} {
		if strings.Contains(metrics, "\nidem_relay_"+h+"_duration_seconds_count 0\n") {
			t.Errorf("idem_relay_%s_duration_seconds has no sample", h)
		}
	}
	if code, body := get(t, "http://"+addr+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/: %d\n%s", code, body)
	}
	if code, body := get(t, "http://"+addr+"/debug/pprof/heap?debug=1"); code != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Errorf("/debug/pprof/heap: %d", code)
	}
	if code, body := get(t, "http://"+addr+"/healthz"); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz: %d %q", code, body)
	}
}
