package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/cdc"
)

// idem cdc publishes table rows and WAL messages, serves its metrics and
// health, stops on cancel; idem cdc drop-slot retires the slot.
func TestCDCCommand(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	ctx := context.Background()
	slot := cdc.SlotName(idemmsg.Tables{Schema: pg.Schema})
	t.Cleanup(func() {
		_ = cdc.DropSlot(context.Background(), pg.URL, slot)
		_, _ = pg.Pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+slot)
	})
	tw := outbox.NewWriter(pg.Driver)
	lw, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
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
	stderrOut := &syncWriter{w: &strings.Builder{}}
	go func() {
		e := &env{stdout: io.Discard, stderr: stderrOut, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
		done <- run(rctx, e, []string{"cdc", "--db", pg.URL, "--schema", pg.Schema, "--prefix", pg.Schema, "--broker", broker.URL, "--metrics-addr", addr})
	}()
	stopped := false
	defer func() {
		if !stopped {
			stop()
			<-done
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _ := get(t, "http://"+addr+"/healthz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("idem cdc never healthy")
		}
		time.Sleep(20 * time.Millisecond)
	}
	const events = 6
	err = pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
		for i := range events {
			ev, err := idemmsg.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]int{"i": i})
			if err != nil {
				return err
			}
			w := tw
			if i%2 == 1 {
				w = lw
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
	var metrics string
	for !strings.Contains(metrics, fmt.Sprintf("\nidem_cdc_published_total{slot=%q} %d\n", slot, events)) {
		if time.Now().After(deadline) {
			t.Fatalf("idem_cdc_published_total never reached %d; last scrape:\n%s", events, metrics)
		}
		time.Sleep(20 * time.Millisecond)
		_, metrics = get(t, "http://"+addr+"/metrics")
	}
	if received.Load() != events {
		t.Errorf("the broker received %d messages, want %d", received.Load(), events)
	}
	for _, want := range []string{"idem_cdc_slot_lag_bytes{", "idem_cdc_commit_to_publish_seconds_count{", "idem_cdc_streaming{"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	stop()
	stopped = true
	if code := <-done; code != 0 {
		t.Fatalf("idem cdc exited with %d:\n%s", code, stderrOut.String())
	}
	if n := pg.Count(t, "outbox"); n != 0 {
		t.Errorf("%d rows left", n)
	}
	code, out, errOut := idem(t, nil, "", "cdc", "drop-slot", "--db", pg.URL, "--schema", pg.Schema)
	if code != 0 || !strings.Contains(out, "dropped replication slot "+slot) {
		t.Fatalf("drop-slot = %d %q %q", code, out, errOut)
	}
	code, _, errOut = idem(t, nil, "", "cdc", "drop-slot", "--db", pg.URL, "--schema", pg.Schema)
	if code != 1 || !strings.Contains(errOut, "not found") {
		t.Fatalf("drop-slot again = %d %q", code, errOut)
	}
}

func TestCDCUsage(t *testing.T) {
	t.Parallel()
	code, out, _ := idem(t, nil, "", "help", "cdc")
	for _, want := range []string{"wal_level = logical", "max_slot_wal_keep_size", "drop-slot", "--keep-rows", "REPLICATION",
		"binlog_format = ROW", "binlog_row_metadata = FULL", "REPLICATION SLAVE, REPLICATION CLIENT", "reset-position", "--server-id"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("help cdc = %d, no %q", code, want)
		}
	}
	code, _, errOut := idem(t, nil, "", "cdc", "--db", "sqlite:///tmp/x.db")
	if code != 2 || !strings.Contains(errOut, "idem relay") {
		t.Errorf("cdc on SQLite = %d %q", code, errOut)
	}
	code, _, errOut = idem(t, nil, "", "cdc", "--db", "mysql://x/y", "--slot", "s")
	if code != 2 || !strings.Contains(errOut, "PostgreSQL's") {
		t.Errorf("cdc --slot on MySQL = %d %q", code, errOut)
	}
	code, _, errOut = idem(t, nil, "", "cdc", "drop-slot", "--db", "mysql://x/y")
	if code != 2 || !strings.Contains(errOut, "reset-position") {
		t.Errorf("cdc drop-slot on MySQL = %d %q", code, errOut)
	}
	code, _, errOut = idem(t, nil, "", "cdc", "sideways")
	if code != 2 || !strings.Contains(errOut, "drop-slot") {
		t.Errorf("cdc sideways = %d %q", code, errOut)
	}
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.(fmt.Stringer).String()
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
