package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/webhook"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// hook is an HTTP endpoint receiving the batches of the webhook publisher:
// the broker of relay processes started by the tests.
type hook struct {
	srv  *httptest.Server
	mu   sync.Mutex
	msgs []webhook.Message
}

func newHook(t *testing.T) *hook {
	h := &hook{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req webhook.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		h.msgs = append(h.msgs, req.Messages...)
		h.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) url() string { return h.srv.URL + "/events" }

func (h *hook) ids() []uuid.UUID {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]uuid.UUID, len(h.msgs))
	for i, m := range h.msgs {
		out[i] = m.EventID
	}
	return out
}

func (h *hook) messages() []idem.Message {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]idem.Message, len(h.msgs))
	for i, m := range h.msgs {
		out[i] = idem.Message{EventID: m.EventID, EventName: m.EventName, AggregateType: m.AggregateType, Key: m.Key, Headers: m.Headers, Body: m.Body}
	}
	return out
}

// syncBuffer collects a child process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a running idem process.
type proc struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	done   chan struct{}
	result error
}

// startIdem starts the idem binary with args, the database and broker URLs in
// its environment, and extra variables.
func startIdem(t *testing.T, pg *testdb.PG, brokerURL string, extraEnv []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(idemBinary(t), args...)
	cmd.Env = append(os.Environ(), "IDEM_DB_URL="+pg.URL, "IDEM_BROKER_URL="+brokerURL)
	cmd.Env = append(cmd.Env, extraEnv...)
	p := &proc{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.Stdin = strings.NewReader("")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.result = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("idem %s output:\n%s", strings.Join(args, " "), p.out.String())
		}
	})
	return p
}

// wait waits for the process to end and returns its wait status.
func (p *proc) wait(t *testing.T, d time.Duration) syscall.WaitStatus {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("process still running after %v; output:\n%s", d, p.out.String())
	}
	return p.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

func relayArgs(extra ...string) []string {
	return append([]string{"relay", "--workers", "1", "--poll-interval", "50ms", "--metrics-addr", "", "--log-level", "debug"}, extra...)
}

// TestCrashAfterPublishBeforeMark kills the relay after the broker confirmed a
// batch but before it was marked: a restarted relay publishes the rows again,
// nothing is lost, and the consumer's deduplication absorbs the repeats.
func TestCrashAfterPublishBeforeMark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newHook(t)
	var evs []idem.Event
	for a := range 10 {
		for v := 1; v <= 3; v++ {
			evs = append(evs, event(t, fmt.Sprint(a), v))
		}
	}
	b.insert(t, evs...)

	p := startIdem(t, b.pg, h.url(), []string{fault.EnvVar + "=" + fault.RelayAfterPublishBeforeMark}, relayArgs("--lease", "2s")...)
	if ws := p.wait(t, 30*time.Second); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("relay exited with %v, want killed by its fault point; output:\n%s", ws, p.out.String())
	}
	firstRun := countIDs(h.ids())
	if len(firstRun) == 0 {
		t.Fatal("the killed relay published nothing before dying")
	}
	if n := b.pg.Count(t, "outbox WHERE published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows marked published by a relay killed before marking", n)
	}

	p2 := startIdem(t, b.pg, h.url(), nil, relayArgs("--lease", "2s")...)
	testsvc.WaitFor(t, 30*time.Second, "every row published after the restart", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if ws := p2.wait(t, 30*time.Second); ws.ExitStatus() != 0 {
		t.Fatalf("relay exited with %v after SIGTERM", ws)
	}

	all := countIDs(h.ids())
	for _, ev := range evs {
		want := 1 + firstRun[ev.ID]
		if all[ev.ID] != want {
			t.Errorf("event %s received %d times, want %d", ev.ID, all[ev.ID], want)
		}
	}
	checkOrder(t, h.messages())

	// The consumer's deduplication: each event applies once.
	applied := 0
	for _, id := range h.ids() {
		inserted, err := b.pg.Driver.Dialect().MarkProcessed(context.Background(), b.pg.Driver.Pool(), "stock", []driver.Mark{{ID: id}})
		if err != nil {
			t.Fatal(err)
		}
		if inserted[0] {
			applied++
		}
	}
	if applied != len(evs) {
		t.Errorf("consumer applied %d events, want %d", applied, len(evs))
	}
}

// TestCrashAfterClaim kills the relay after it claimed a batch and before it
// published anything: another worker takes the rows once the lease expires.
func TestCrashAfterClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newHook(t)
	var evs []idem.Event
	for a := range 20 {
		evs = append(evs, event(t, fmt.Sprint(a), 1))
	}
	b.insert(t, evs...)

	p := startIdem(t, b.pg, h.url(), []string{fault.EnvVar + "=" + fault.RelayAfterClaim}, relayArgs("--lease", "1s")...)
	if ws := p.wait(t, 30*time.Second); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("relay exited with %v, want killed by its fault point", ws)
	}
	if got := len(h.ids()); got != 0 {
		t.Fatalf("relay killed before publishing published %d messages", got)
	}
	var leased int
	var leaseEnd time.Time
	if err := b.pg.Pool.QueryRow(context.Background(),
		"SELECT count(*), max(lease_until) FROM outbox WHERE lease_owner IS NOT NULL").Scan(&leased, &leaseEnd); err != nil {
		t.Fatal(err)
	}
	if leased != len(evs) {
		t.Fatalf("%d rows leased by the dead relay, want %d", leased, len(evs))
	}

	r := b.start(t, fastConfig(t))
	if err := b.pub.WaitLen(testsvc.Ctx(t, 30*time.Second), len(evs)); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 10*time.Second, "rows marked", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	if n := b.pg.Count(t, "outbox WHERE published_at < $1", leaseEnd); n != 0 {
		t.Errorf("%d rows published before the dead relay's lease expired", n)
	}
	if s := r.Stats(); s.Takeovers != int64(len(evs)) {
		t.Errorf("Stats().Takeovers = %d, want %d", s.Takeovers, len(evs))
	}
}

// TestRelayCommandServesMetrics runs "idem relay" with its metrics endpoint,
// then stops it with SIGTERM.
func TestRelayCommandServesMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newHook(t)
	b.insert(t, event(t, "1", 1), event(t, "2", 1))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	p := startIdem(t, b.pg, h.url(), nil, "relay", "--metrics-addr", addr, "--poll-interval", "50ms")
	testsvc.WaitFor(t, 30*time.Second, "rows published", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d %s", code, body)
	}
	code, body := get("/metrics")
	for _, want := range []string{"idem_relay_published_total 2", "idem_relay_backlog_rows", "idem_relay_oldest_unpublished_age_seconds",
		"idem_relay_publish_errors_total", "idem_relay_lease_takeovers_total", "idem_relay_commit_to_publish_seconds_bucket"} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if ws := p.wait(t, 30*time.Second); ws.ExitStatus() != 0 {
		t.Fatalf("relay exited with %v after SIGTERM", ws)
	}
	if n := b.pg.Count(t, "outbox WHERE lease_owner IS NOT NULL"); n != 0 {
		t.Errorf("%d rows still leased after a graceful stop", n)
	}
}

// TestReplayCommand: "idem replay" re-publishes exactly the events of the
// period, with their original ids, after a summary and a confirmation.
func TestReplayCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newHook(t)
	base := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	var evs []idem.Event
	for m := range 60 {
		ev := event(t, fmt.Sprint(m%7), m+1)
		ev.OccurredAt = base.Add(time.Duration(m) * time.Minute)
		evs = append(evs, ev)
	}
	b.insert(t, evs...)
	b.start(t, fastConfig(t))
	testsvc.WaitFor(t, 10*time.Second, "everything published", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})

	args := []string{"replay", "--since", "2026-12-02T08:10:00Z", "--until", "2026-12-02T08:40:00Z"}
	// Without --yes and without an answer, nothing is published.
	p := startIdem(t, b.pg, h.url(), nil, args...)
	if ws := p.wait(t, 30*time.Second); ws.ExitStatus() != 1 || !strings.Contains(p.out.String(), "order.order.changed.v1 30") {
		t.Fatalf("replay without confirmation exited %v:\n%s", ws, p.out.String())
	}
	if n := len(h.ids()); n != 0 {
		t.Fatalf("unconfirmed replay published %d messages", n)
	}

	p = startIdem(t, b.pg, h.url(), nil, append(args, "--yes")...)
	if ws := p.wait(t, 30*time.Second); ws.ExitStatus() != 0 || !strings.Contains(p.out.String(), "Replayed 30 events") {
		t.Fatalf("replay exited %v:\n%s", ws, p.out.String())
	}
	got := countIDs(h.ids())
	for _, ev := range evs {
		in := !ev.OccurredAt.Before(base.Add(10*time.Minute)) && ev.OccurredAt.Before(base.Add(40*time.Minute))
		want := 0
		if in {
			want = 1
		}
		if got[ev.ID] != want {
			t.Errorf("event at %s replayed %d times, want %d", ev.OccurredAt.Format(time.TimeOnly), got[ev.ID], want)
		}
	}
	checkOrder(t, h.messages())
}
