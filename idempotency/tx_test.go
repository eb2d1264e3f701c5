package idempotency_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempotency"
)

// txHandler is the widgets application on Keys.TxHandler: the key's claim,
// the widget, its event and the response in one transaction.
func (a *widgets[TTx]) txHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /widgets", a.keys.TxHandler(a.txCreate))
	return mux
}

func (a *widgets[TTx]) serveTx(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(a.txHandler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func (a *widgets[TTx]) txCreate(ctx context.Context, tx TTx, r *http.Request) (idempotency.Response, error) {
	var in widget
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Name == "" {
		return idempotency.Response{Status: http.StatusBadRequest, Body: []byte(`want {"name": "..."}`)}, nil
	}
	out := widget{ID: uuid.NewString(), Name: in.Name}
	if _, err := a.db.drv.Tx(tx).Exec(ctx, a.db.bind(`INSERT INTO widget (id, name) VALUES (?, ?)`), out.ID, out.Name); err != nil {
		return idempotency.Response{}, err
	}
	ev, err := idem.NewEvent("test.widget.created.v1", "widget", out.ID, out)
	if err != nil {
		return idempotency.Response{}, err
	}
	if err := a.out.Add(ctx, tx, ev); err != nil {
		return idempotency.Response{}, err
	}
	if a.entered != nil {
		a.entered <- struct{}{}
		<-a.gate
	}
	if a.failAfterComplete {
		return idempotency.Response{}, errors.New("failing on purpose")
	}
	if a.beforeCommit != nil {
		a.beforeCommit()
	}
	body, _ := json.Marshal(out)
	return idempotency.Response{Status: http.StatusCreated, Body: body,
		Header: http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"session=s3cret"}}}, nil
}

// TestTxReplayAndMismatch: with the claim in the request's transaction, a
// retry gets the first response, marked replayed, without a second widget
// or event; another body with the key is 422; a request without a key
// runs; a failed request leaves nothing, not even its key, and its retry
// runs at once.
func TestTxReplayAndMismatch(t *testing.T) {
	t.Parallel()
	eachDB(t, testTxReplayAndMismatch[*sql.Tx], testTxReplayAndMismatch[pgx.Tx])
}

func testTxReplayAndMismatch[TTx any](t *testing.T, db testDB[TTx]) {
	app := newWidgets(t, db, idempotency.Config{})
	url := app.serveTx(t)
	first := post(t, url, "k-1", bodyA)
	if first.status != http.StatusCreated || first.replayed || first.header.Get("Set-Cookie") == "" {
		t.Fatalf("first: %v, want 201 with its cookie", first)
	}
	again := post(t, url, "k-1", bodyA)
	if again.status != http.StatusCreated || !again.replayed || again.body != first.body ||
		again.header.Get("Content-Type") != "application/json" || again.header.Get("Set-Cookie") != "" {
		t.Fatalf("retry: %v %v, want the first response replayed, with its Content-Type and without its cookie", again, again.header)
	}
	if r := post(t, url, "k-1", bodyB); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("another body with the key: %v, want 422", r)
	}
	if r := post(t, url, "", bodyA); r.status != http.StatusCreated || r.replayed || r.widget.ID == first.widget.ID {
		t.Fatalf("without a key: %v, want a new widget", r)
	}
	if r := post(t, url, "k-bad", `{}`); r.status != http.StatusBadRequest {
		t.Fatalf("an invalid widget: %v, want the handler's 400", r)
	}
	app.failAfterComplete = true
	if r := post(t, url, "k-fail", bodyA); r.status != http.StatusInternalServerError {
		t.Fatalf("a failing handler: %v, want 500", r)
	}
	app.failAfterComplete = false
	if n := db.count(t, "idempotent_request WHERE idem_key IN ('k-bad', 'k-fail')"); n != 0 {
		t.Fatalf("%d keys left by failed requests, want none", n)
	}
	if r := post(t, url, "k-fail", bodyA); r.status != http.StatusCreated || r.replayed {
		t.Fatalf("retry of the failed request: %v, want it run at once", r)
	}
	if n, e := db.count(t, "widget"), db.count(t, "outbox"); n != 3 || e != 3 {
		t.Fatalf("%d widgets and %d events, want 3 of each", n, e)
	}
	if n := db.count(t, "idempotent_request WHERE state = 'done'"); n != 2 {
		t.Fatalf("%d completed keys, want 2", n)
	}
}

// TestTxConcurrentRequests: while a request holds its key in its
// transaction, a retry waits for it and gets its response, replayed. Many
// requests with one key at once make one widget, every answer that
// widget.
func TestTxConcurrentRequests(t *testing.T) {
	t.Parallel()
	eachDB(t, testTxConcurrent[*sql.Tx], testTxConcurrent[pgx.Tx])
}

func testTxConcurrent[TTx any](t *testing.T, db testDB[TTx]) {
	app := newWidgets(t, db, idempotency.Config{LockWait: 30 * time.Second})
	app.entered, app.gate = make(chan struct{}), make(chan struct{})
	url := app.serveTx(t)
	// A failure while the first request waits must not leave it, and the
	// server's Close, waiting.
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(app.gate) }) }
	t.Cleanup(openGate)
	firstDone := make(chan answer, 1)
	go func() { firstDone <- post(t, url, "k-busy", bodyA) }()
	waitEntered(t, app.entered, firstDone)
	retryDone := make(chan answer, 1)
	before := db.lockWaits(t)
	go func() { retryDone <- post(t, url, "k-busy", bodyA) }()
	waitRetryWaits(t, db, before, retryDone)
	openGate()
	first, retry := <-firstDone, <-retryDone
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("first: %v", first)
	}
	if retry.status != http.StatusCreated || !retry.replayed || retry.widget.ID != first.widget.ID {
		t.Fatalf("retry that waited: %v, want the first's response replayed", retry)
	}

	app.entered = nil
	const n = 16
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i] = post(t, url, "k-race", bodyB)
		})
	}
	close(start)
	wg.Wait()
	created := 0
	for _, a := range answers {
		if a.status != http.StatusCreated || a.widget.ID != answers[0].widget.ID {
			t.Fatalf("answers %v and %v, want one widget for all", answers[0], a)
		}
		if !a.replayed {
			created++
		}
	}
	if created != 1 {
		t.Fatalf("%d answers not replayed, want 1", created)
	}
	if got := db.count(t, "widget WHERE name = 'bellows'"); got != 1 {
		t.Fatalf("%d widgets for %d requests with one key, want 1", got, n)
	}
}

// TestTxLockWait: on PostgreSQL, a retry that waited Config.LockWait for
// the request holding the key gets 409 with Retry-After, then, once the
// request committed, its response.
func TestTxLockWait(t *testing.T) {
	t.Parallel()
	eachPostgres(t, testTxLockWait[*sql.Tx], testTxLockWait[pgx.Tx])
}

func testTxLockWait[TTx any](t *testing.T, db testDB[TTx]) {
	app := newWidgets(t, db, idempotency.Config{LockWait: 100 * time.Millisecond})
	app.entered, app.gate = make(chan struct{}), make(chan struct{})
	url := app.serveTx(t)
	firstDone := make(chan answer, 1)
	go func() { firstDone <- post(t, url, "k-slow", bodyA) }()
	waitEntered(t, app.entered, firstDone)
	busy := post(t, url, "k-slow", bodyA)
	if busy.status != http.StatusConflict || busy.retryAfter != "1" {
		t.Errorf("after LockWait: %v (Retry-After %q), want 409 with Retry-After: 1", busy, busy.retryAfter)
	}
	// Another key is not held up.
	app.entered = nil
	if r := post(t, url, "k-other", bodyB); r.status != http.StatusCreated {
		t.Errorf("another key meanwhile: %v, want 201", r)
	}
	close(app.gate)
	first := <-firstDone
	if r := post(t, url, "k-slow", bodyA); r.status != http.StatusCreated || !r.replayed || r.widget.ID != first.widget.ID {
		t.Fatalf("after the first: %v, want its replay", r)
	}
}

// TestTxCrashedRequestRollsBack kills (SIGKILL) a process whose request
// claimed its key and wrote its widget and event in its transaction,
// before the commit. Nothing remains, not even the claim: a retry runs at
// once, once.
func TestTxCrashedRequestRollsBack(t *testing.T) {
	t.Parallel()
	eachDB(t, testTxCrashed, nil)
}

func testTxCrashed(t *testing.T, db testDB[*sql.Tx]) {
	spec, _ := json.Marshal(crashSpec{Dialect: db.dialect, URL: db.url, Key: "k-killed", Body: bodyA, Tx: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "before commit" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child: %q %v, want it stopped before its commit", line, err)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = cmd.Wait()

	if n, e, k := db.count(t, "widget"), db.count(t, "outbox"), db.count(t, "idempotent_request"); n != 0 || e != 0 || k != 0 {
		t.Fatalf("after the kill: %d widgets, %d events, %d keys; want none", n, e, k)
	}
	url := newWidgets(t, db, idempotency.Config{}).serveTx(t)
	first := post(t, url, "k-killed", bodyA)
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("retry: %v, want it run at once", first)
	}
	if r := post(t, url, "k-killed", bodyA); !r.replayed || r.widget.ID != first.widget.ID {
		t.Fatalf("next retry: %v, want the replay", r)
	}
	if n, e := db.count(t, "widget"), db.count(t, "outbox"); n != 1 || e != 1 {
		t.Fatalf("%d widgets, %d events; want 1 of each", n, e)
	}
}

// TestTxExpiry: with the claim in the request's transaction, a key is
// remembered for the TTL (another body is 422, the same is replayed), then
// forgotten: the key with another body runs, and its response is replayed.
func TestTxExpiry(t *testing.T) {
	t.Parallel()
	eachDB(t, testTxExpiry[*sql.Tx], testTxExpiry[pgx.Tx])
}

func testTxExpiry[TTx any](t *testing.T, db testDB[TTx]) {
	var clk clock
	url := newWidgets(t, db, idempotency.Config{TTL: time.Hour, Now: clk.now}).serveTx(t)
	first := post(t, url, "k-old", bodyA)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %v", first)
	}
	clk.advance(59 * time.Minute)
	if r := post(t, url, "k-old", bodyB); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("before the TTL, another body: %v, want 422", r)
	}
	if r := post(t, url, "k-old", bodyA); !r.replayed || r.widget.ID != first.widget.ID {
		t.Fatalf("before the TTL: %v, want the replay", r)
	}
	clk.advance(time.Minute)
	again := post(t, url, "k-old", bodyB)
	if again.status != http.StatusCreated || again.replayed || again.widget.Name != "bellows" {
		t.Fatalf("after the TTL, another body: %v, want it run", again)
	}
	if r := post(t, url, "k-old", bodyB); !r.replayed || r.widget.ID != again.widget.ID {
		t.Fatalf("its retry: %v, want its replay", r)
	}
	if n := db.count(t, "widget"); n != 2 {
		t.Fatalf("%d widgets, want 2", n)
	}
}
