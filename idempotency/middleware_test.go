package idempotency_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/internal/testdb"
)

const (
	bodyA = `{"name":"anvil"}`
	bodyB = `{"name":"bellows"}`
)

// TestReplayAndMismatch: a retry with the same key and bytes gets the first
// response, marked replayed, without a second widget or event; another body
// with the key is 422; a request without a key runs.
func TestReplayAndMismatch(t *testing.T) {
	t.Parallel()
	eachDB(t, testReplayAndMismatch[*sql.Tx], testReplayAndMismatch[pgx.Tx])
}

func testReplayAndMismatch[TTx any](t *testing.T, db testDB[TTx]) {
	url := newWidgets(t, db, idempotency.Config{}).serve(t)
	first := post(t, url, "k-1", bodyA)
	if first.status != http.StatusCreated || first.replayed || first.header.Get("Set-Cookie") == "" {
		t.Fatalf("first: %v, want 201 with its cookie", first)
	}
	again := post(t, url, "k-1", bodyA)
	if again.status != http.StatusCreated || !again.replayed || again.body != first.body ||
		again.header.Get("Content-Type") != "application/json" || again.header.Get("Set-Cookie") != "" {
		t.Fatalf("retry: %v %v, want the first response replayed, with its Content-Type and without its cookie", again, again.header)
	}
	other := post(t, url, "k-1", bodyB)
	if other.status != http.StatusUnprocessableEntity || other.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("another body with the key: %v, want a 422 problem", other)
	}
	if r := post(t, url, "k-1", bodyA+" "); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("the same content in other bytes: %v, want 422 (the fingerprint is the bytes)", r)
	}
	if r := post(t, url, "", bodyA); r.status != http.StatusCreated || r.replayed || r.widget.ID == first.widget.ID {
		t.Fatalf("without a key: %v, want a new widget", r)
	}
	if n, e := db.count(t, "widget"), db.count(t, "outbox"); n != 2 || e != 2 {
		t.Fatalf("%d widgets and %d events, want 2 of each", n, e)
	}
}

// TestScope: the same key in two scopes is two requests.
func TestScope(t *testing.T) {
	t.Parallel()
	s := testdb.NewSQLite(t)
	db := testDB[*sql.Tx]{drv: s.Driver, dialect: "sqlite"}
	db.exec(t, widgetTable)
	url := newWidgets(t, db, idempotency.Config{Scope: func(r *http.Request) string { return r.Header.Get("X-Account") }}).serve(t)
	send := func(account string) answer {
		req, _ := http.NewRequest(http.MethodPost, url+"/widgets", strings.NewReader(bodyA))
		req.Header.Set(idempotency.HeaderKey, "shared")
		req.Header.Set("X-Account", account)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return answer{status: resp.StatusCode, replayed: resp.Header.Get(idempotency.HeaderReplayed) == "true"}
	}
	if a, b, a2 := send("a"), send("b"), send("a"); a.status != 201 || a.replayed || b.status != 201 || b.replayed || !a2.replayed {
		t.Fatalf("accounts a, b, a: %v %v %v; want two new widgets, then a replay", a, b, a2)
	}
	if n := db.count(t, "widget"); n != 2 {
		t.Fatalf("%d widgets, want 2", n)
	}
}

// TestConcurrentRequests: while a request with a key runs, a second one
// with the key gets 409 and Retry-After; then the replay. Many requests
// with one key at once make one widget, and every answer is that widget
// or 409.
func TestConcurrentRequests(t *testing.T) {
	t.Parallel()
	eachDB(t, testConcurrentRequests[*sql.Tx], testConcurrentRequests[pgx.Tx])
}

func testConcurrentRequests[TTx any](t *testing.T, db testDB[TTx]) {
	app := newWidgets(t, db, idempotency.Config{})
	app.entered, app.gate = make(chan struct{}), make(chan struct{})
	url := app.serve(t)
	firstDone := make(chan answer, 1)
	go func() { firstDone <- post(t, url, "k-busy", bodyA) }()
	waitEntered(t, app.entered, firstDone)
	busy := post(t, url, "k-busy", bodyA)
	if busy.status != http.StatusConflict || busy.retryAfter != "1" {
		t.Errorf("while the first runs: %v (Retry-After %q), want 409 with Retry-After: 1", busy, busy.retryAfter)
	}
	close(app.gate)
	first := <-firstDone
	if first.status != http.StatusCreated {
		t.Fatalf("first: %v", first)
	}
	if r := post(t, url, "k-busy", bodyA); r.status != http.StatusCreated || !r.replayed || r.widget.ID != first.widget.ID {
		t.Fatalf("after the first: %v, want its replay", r)
	}

	// Many at once, the handler not held.
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
	var id string
	created := 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated:
			created++
			if id == "" {
				id = a.widget.ID
			}
			if a.widget.ID != id {
				t.Fatalf("two widgets answered for one key: %s and %s", id, a.widget.ID)
			}
		case a.status == http.StatusConflict:
		default:
			t.Fatalf("unexpected answer %v", a)
		}
	}
	if created == 0 {
		t.Fatal("no request made the widget")
	}
	if got := db.count(t, "widget WHERE name = 'bellows'"); got != 1 {
		t.Fatalf("%d widgets for %d requests with one key, want 1", got, n)
	}
}

// TestTakeOverAfterLockTimeout: a request that claimed its key and never
// completed it (its process died) holds the key until the lock timeout;
// then a retry takes it over and runs, and the first request cannot
// complete any more.
func TestTakeOverAfterLockTimeout(t *testing.T) {
	t.Parallel()
	eachDB(t, testTakeOver[*sql.Tx], testTakeOver[pgx.Tx])
}

func testTakeOver[TTx any](t *testing.T, db testDB[TTx]) {
	var clk clock
	app := newWidgets(t, db, idempotency.Config{LockTimeout: 5 * time.Second, Now: clk.now})
	url := app.serve(t)
	ctx := context.Background()
	gone, err := app.keys.Claim(ctx, idempotency.Request{Key: "k-crash", Fingerprint: idempotency.Fingerprint(http.MethodPost, "/widgets", []byte(bodyA))})
	if err != nil || gone.Outcome != idempotency.Claimed {
		t.Fatalf("claim: %+v %v", gone, err)
	}
	if r := post(t, url, "k-crash", bodyA); r.status != http.StatusConflict {
		t.Fatalf("within the lock timeout: %v, want 409", r)
	}
	clk.advance(4 * time.Second)
	if r := post(t, url, "k-crash", bodyA); r.status != http.StatusConflict {
		t.Fatalf("just before the lock timeout: %v, want 409", r)
	}
	if r := post(t, url, "k-crash", bodyB); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("another body: %v, want 422", r)
	}
	clk.advance(time.Second)
	first := post(t, url, "k-crash", bodyA)
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("after the lock timeout: %v, want the request run", first)
	}
	// The request that was taken over completes too late.
	tx, err := db.drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = app.keys.Complete(ctx, tx, gone, idempotency.Response{Status: 201})
	_ = db.drv.Rollback(ctx, tx) // before the next request: SQLite has one connection
	if !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("completion by the request taken over: %v, want ErrClaimLost", err)
	}
	if r := post(t, url, "k-crash", bodyA); !r.replayed || r.widget.ID != first.widget.ID {
		t.Fatalf("then: %v, want the replay of the retry's response", r)
	}
	if n := db.count(t, "widget"); n != 1 {
		t.Fatalf("%d widgets, want 1", n)
	}
}

// TestTakeOverRacesCompletion: a retry that takes the key over while the
// first request's completion is committing gets the replay, never a
// second run. The first request holds its transaction open after
// completing, past the lock timeout.
func TestTakeOverRacesCompletion(t *testing.T) {
	t.Parallel()
	eachDB(t, testTakeOverRacesCompletion, nil)
}

func testTakeOverRacesCompletion(t *testing.T, db testDB[*sql.Tx]) {
	if db.dialect == "sqlite" {
		// One writer at a time: the retry's claim waits for the first
		// request's commit, then finds the response.
		t.Log("SQLite serialises the claim behind the transaction")
	}
	var clk clock
	app := newWidgets(t, db, idempotency.Config{LockTimeout: 5 * time.Second, Now: clk.now})
	url := app.serve(t)
	held := make(chan struct{})
	release := make(chan struct{})
	app.beforeCommit = func() {
		close(held)
		<-release
	}
	// A failure while the first request waits must not leave it, and the
	// server's Close, waiting.
	var released sync.Once
	releaseFirst := func() { released.Do(func() { close(release) }) }
	t.Cleanup(releaseFirst)
	firstDone := make(chan answer, 1)
	go func() { firstDone <- post(t, url, "k-late", bodyA) }()
	<-held
	app.beforeCommit = nil
	clk.advance(6 * time.Second) // the first request's lock has lapsed
	retryDone := make(chan answer, 1)
	before := db.lockWaits(t)
	go func() { retryDone <- post(t, url, "k-late", bodyA) }()
	// The retry's takeover waits on the completion's row lock (or, on
	// SQLite, its claim on the write lock): once it does, let the first
	// commit.
	waitRetryWaits(t, db, before, retryDone)
	releaseFirst()
	first, retry := <-firstDone, <-retryDone
	if first.status != http.StatusCreated {
		t.Fatalf("first: %v", first)
	}
	if retry.status != http.StatusCreated || !retry.replayed || retry.widget.ID != first.widget.ID {
		t.Fatalf("retry during the first's commit: %v, want the first's response replayed", retry)
	}
	if n := db.count(t, "widget"); n != 1 {
		t.Fatalf("%d widgets, want 1", n)
	}
}

// TestExpiry: after the TTL the key is forgotten (another body runs), and
// Purge deletes expired keys only.
func TestExpiry(t *testing.T) {
	t.Parallel()
	eachDB(t, testExpiry[*sql.Tx], testExpiry[pgx.Tx])
}

func testExpiry[TTx any](t *testing.T, db testDB[TTx]) {
	var clk clock
	app := newWidgets(t, db, idempotency.Config{TTL: time.Hour, Now: clk.now, PurgeBatchSize: 2})
	url := app.serve(t)
	for _, k := range []string{"k-old-1", "k-old-2", "k-old-3"} {
		if r := post(t, url, k, bodyA); r.status != http.StatusCreated {
			t.Fatalf("%s: %v", k, r)
		}
	}
	clk.advance(59 * time.Minute)
	if r := post(t, url, "k-old-1", bodyB); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("before the TTL: %v, want 422", r)
	}
	if r := post(t, url, "k-new", bodyA); r.status != http.StatusCreated {
		t.Fatalf("k-new: %v", r)
	}
	clk.advance(time.Minute)
	if r := post(t, url, "k-old-1", bodyB); r.status != http.StatusCreated || r.replayed || r.widget.Name != "bellows" {
		t.Fatalf("after the TTL, another body: %v, want it run", r)
	}
	n, err := app.keys.Purge(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// k-old-2 and k-old-3 expired; k-old-1 was claimed afresh, k-new runs.
	if n != 2 || db.count(t, "idempotent_request") != 2 {
		t.Fatalf("purged %d keys, %d left; want 2 purged, 2 left", n, db.count(t, "idempotent_request"))
	}
	if r := post(t, url, "k-new", bodyA); !r.replayed {
		t.Fatalf("a key not expired after the purge: %v, want the replay", r)
	}
}

// TestRolledBackCompletionReleasesTheKey: a handler that completed its key
// and then rolled back (an error before its commit) leaves no key: the
// retry runs at once, and one widget is made.
func TestRolledBackCompletionReleasesTheKey(t *testing.T) {
	t.Parallel()
	eachDB(t, testRolledBack[*sql.Tx], testRolledBack[pgx.Tx])
}

func testRolledBack[TTx any](t *testing.T, db testDB[TTx]) {
	app := newWidgets(t, db, idempotency.Config{})
	url := app.serve(t)
	app.failAfterComplete = true
	if r := post(t, url, "k-fail", bodyA); r.status != http.StatusInternalServerError {
		t.Fatalf("failing: %v", r)
	}
	if n := db.count(t, "idempotent_request"); n != 0 {
		t.Fatalf("%d keys after a failed request, want it released", n)
	}
	app.failAfterComplete = false
	if r := post(t, url, "k-fail", bodyA); r.status != http.StatusCreated || r.replayed {
		t.Fatalf("retry: %v, want it run", r)
	}
	if n, e := db.count(t, "widget"), db.count(t, "outbox"); n != 1 || e != 1 {
		t.Fatalf("%d widgets, %d events; want 1 of each", n, e)
	}
}

// TestRecordedByTheMiddleware: a handler that does not complete its key
// has its 2xx response recorded and replayed; an error response releases
// the key; a panic too.
func TestRecordedByTheMiddleware(t *testing.T) {
	t.Parallel()
	s := testdb.NewSQLite(t)
	keys, err := idempotency.New(s.Driver, idempotency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	status := atomic.Int32{}
	status.Store(http.StatusOK)
	h := keys.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if status.Load() == 0 {
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Call", fmt.Sprint(n))
		w.WriteHeader(int(status.Load()))
		fmt.Fprintf(w, "call %d", n)
		_, _ = w.Write([]byte(", streamed"))
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	send := func(key string) (int, http.Header, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err.Error()
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, resp.Header, b.String()
	}
	if code, _, body := send("k-ok"); code != 200 || body != "call 1, streamed" {
		t.Fatalf("first: %d %q", code, body)
	}
	if code, h, body := send("k-ok"); code != 200 || body != "call 1, streamed" || h.Get("X-Call") != "1" || h.Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %q %v, want the first response replayed", code, body, h)
	}
	status.Store(http.StatusServiceUnavailable)
	for i := range 2 {
		if code, _, _ := send("k-503"); code != 503 {
			t.Fatalf("503 attempt %d: %d", i, code)
		}
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("handler called %d times, want 3: once per request but the replay", n)
	}
	// net/http's client sends a request with an Idempotency-Key again when
	// the connection drops before an answer: the panic may run twice.
	status.Store(0)
	send("k-panic")
	if n := s.Count(t, "idempotent_request WHERE idem_key = 'k-panic'"); n != 0 {
		t.Fatalf("the key of a request that panicked is still there")
	}
	status.Store(http.StatusAccepted)
	if code, h, _ := send("k-panic"); code != http.StatusAccepted || h.Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("after a panic: %d, want the request run", code)
	}
}

// TestRefusedRequests: unusable keys are 400 and run nothing, a body over
// the limit is 413, Required makes the key mandatory, safe methods pass
// through; every refusal is a problem document.
func TestRefusedRequests(t *testing.T) {
	t.Parallel()
	s := testdb.NewSQLite(t)
	keys, err := idempotency.New(s.Driver, idempotency.Config{MaxBodyBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	required, err := idempotency.New(s.Driver, idempotency.Config{Required: true})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) })
	for _, tc := range []struct {
		name   string
		h      http.Handler
		method string
		keys   []string // nil: no header
		body   string
		want   int
	}{
		{"empty", keys.Middleware(next), "POST", []string{""}, "{}", 400},
		{"blank", keys.Middleware(next), "POST", []string{"   "}, "{}", 400},
		{"two headers", keys.Middleware(next), "POST", []string{"a", "b"}, "{}", 400},
		{"tab", keys.Middleware(next), "POST", []string{"a\tb"}, "{}", 400},
		{"NUL", keys.Middleware(next), "POST", []string{"a\x00b"}, "{}", 400},
		{"DEL", keys.Middleware(next), "POST", []string{"a\x7fb"}, "{}", 400},
		{"C1 control", keys.Middleware(next), "POST", []string{"a\u0085b"}, "{}", 400},
		{"not UTF-8", keys.Middleware(next), "POST", []string{"k-\xff\xfe"}, "{}", 400},
		{"too long", keys.Middleware(next), "POST", []string{strings.Repeat("k", idempotency.MaxKeyLength+1)}, "{}", 400},
		{"longest", keys.Middleware(next), "POST", []string{strings.Repeat("k", idempotency.MaxKeyLength)}, "{}", 200},
		{"UTF-8", keys.Middleware(next), "POST", []string{"clé-été-☃"}, "{}", 200},
		{"quoted, as the draft's syntax", keys.Middleware(next), "POST", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "{}", 200},
		{"body too large", keys.Middleware(next), "POST", []string{"big"}, strings.Repeat("x", 65), 413},
		{"body at the limit", keys.Middleware(next), "PATCH", []string{"at-limit"}, strings.Repeat("x", 64), 200},
		{"no key", keys.Middleware(next), "POST", nil, "{}", 200},
		{"no key, required", required.Middleware(next), "POST", nil, "{}", 400},
		{"GET, required", required.Middleware(next), "GET", nil, "", 200},
		{"GET with a bad key", keys.Middleware(next), "GET", []string{""}, "", 200},
	} {
		before := calls.Load()
		req := httptest.NewRequest(tc.method, "/x", strings.NewReader(tc.body))
		if tc.keys != nil {
			req.Header[idempotency.HeaderKey] = tc.keys
		}
		rec := httptest.NewRecorder()
		tc.h.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("%s: %d, want %d: %s", tc.name, rec.Code, tc.want, rec.Body)
			continue
		}
		ran := calls.Load() != before
		if ran != (tc.want == 200) {
			t.Errorf("%s: handler ran = %v", tc.name, ran)
		}
		if tc.want != 200 {
			var p struct {
				Status int    `json:"status"`
				Detail string `json:"detail"`
			}
			if rec.Header().Get("Content-Type") != "application/problem+json" || json.Unmarshal(rec.Body.Bytes(), &p) != nil || p.Status != tc.want || p.Detail == "" {
				t.Errorf("%s: not a problem document with its status and a detail: %s", tc.name, rec.Body)
			}
		}
	}
	// Over the wire, the server refuses most control characters itself;
	// whatever reaches the middleware is refused there.
	srv := httptest.NewServer(keys.Middleware(next))
	t.Cleanup(srv.Close)
	for _, key := range []string{"a\x01b", "a\tb"} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", key)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("key %q over HTTP: %d, want 400", key, resp.StatusCode)
		}
	}
	if n := s.Count(t, "idempotent_request WHERE idem_key LIKE 'a_b'"); n != 0 {
		t.Fatalf("%d refused keys stored", n)
	}
}

// TestClaimErrors: what Claim and Complete refuse.
func TestClaimErrors(t *testing.T) {
	t.Parallel()
	s := testdb.NewSQLite(t)
	keys, err := idempotency.New(s.Driver, idempotency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, req := range []idempotency.Request{
		{Key: "", Fingerprint: "f"},
		{Key: " k", Fingerprint: "f"},
		{Key: "k", Fingerprint: ""},
		{Key: "k", Fingerprint: strings.Repeat("f", 256)},
		{Key: "k", Fingerprint: "f\x00"},
		{Key: "k", Scope: "s ", Fingerprint: "f"},
	} {
		if _, err := keys.Claim(ctx, req); err == nil {
			t.Errorf("claim %+v: no error", req)
		}
	}
	if err := idempotency.ValidateKey(""); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Errorf("ValidateKey(\"\"): %v, want ErrInvalidKey", err)
	}
	c, err := keys.Claim(ctx, idempotency.Request{Key: "k", Fingerprint: "f"})
	if err != nil || c.Outcome != idempotency.Claimed {
		t.Fatalf("claim: %+v %v", c, err)
	}
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.Complete(ctx, tx, c, idempotency.Response{Status: 42}); err == nil {
		t.Error("completed with status 42")
	}
	if err := keys.Complete(ctx, tx, c, idempotency.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	if err := keys.Complete(ctx, tx, c, idempotency.Response{Status: 200}); err == nil {
		t.Error("completed twice")
	}
	if err := keys.Complete(ctx, tx, nil, idempotency.Response{Status: 200}); err != nil {
		t.Errorf("complete without a claim: %v, want nothing done", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	replay, err := keys.Claim(ctx, idempotency.Request{Key: "k", Fingerprint: "f"})
	if err != nil || replay.Outcome != idempotency.Replay || replay.Response.Status != 200 {
		t.Fatalf("claim after completion: %+v %v", replay, err)
	}
	tx, err = s.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := keys.Complete(ctx, tx, replay, idempotency.Response{Status: 200}); err == nil {
		t.Error("completed a replay")
	}
	if _, err := idempotency.New(s.Driver, idempotency.Config{LockTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "LockTimeout") {
		t.Errorf("negative LockTimeout: %v, want an error naming the field", err)
	}
}
