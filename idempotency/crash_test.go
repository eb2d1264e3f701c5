package idempotency_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/outbox"
)

// crashChildEnv makes the test binary a child process that serves one
// request with a key and stops before its commit, until it is killed: a
// JSON crashSpec.
const crashChildEnv = "IDEM_IDEMPOTENCY_CRASH_CHILD"

type crashSpec struct {
	Dialect, URL, Key, Body string
	// Tx serves the request with Keys.TxHandler: the claim is in the
	// request's transaction.
	Tx bool
}

// TestCrashedRequestIsTakenOver kills (SIGKILL) a process whose request
// claimed its key, wrote its widget and event and completed the key in its
// transaction, before the commit. Nothing of it remains but the claim: a
// retry gets 409 until the lock timeout, then runs, once.
func TestCrashedRequestIsTakenOver(t *testing.T) {
	t.Parallel()
	eachDB(t, testCrashedRequest, nil)
}

func testCrashedRequest(t *testing.T, db testDB[*sql.Tx]) {
	spec, _ := json.Marshal(crashSpec{Dialect: db.dialect, URL: db.url, Key: "k-killed", Body: bodyA})
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

	if n, e := db.count(t, "widget"), db.count(t, "outbox"); n != 0 || e != 0 {
		t.Fatalf("after the kill: %d widgets, %d events; want none", n, e)
	}
	if n := db.count(t, "idempotent_request WHERE state = 'processing'"); n != 1 {
		t.Fatalf("after the kill: %d processing keys, want the child's claim", n)
	}
	url := newWidgets(t, db, idempotency.Config{}).serve(t)
	if r := post(t, url, "k-killed", bodyA); r.status != http.StatusConflict {
		t.Fatalf("retry within the lock timeout: %v, want 409", r)
	}
	// A server whose clock is past the child's lock timeout.
	later := newWidgets(t, db, idempotency.Config{Now: func() time.Time { return time.Now().Add(idempotency.LockTimeoutDefault + time.Second) }}).serve(t)
	first := post(t, later, "k-killed", bodyA)
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("retry after the lock timeout: %v, want it run", first)
	}
	if r := post(t, later, "k-killed", bodyA); !r.replayed || r.widget.ID != first.widget.ID {
		t.Fatalf("next retry: %v, want the replay", r)
	}
	if n, e := db.count(t, "widget"), db.count(t, "outbox"); n != 1 || e != 1 {
		t.Fatalf("%d widgets, %d events; want 1 of each", n, e)
	}
}

// crashChild is the child process of TestCrashedRequestIsTakenOver.
func crashChild() int {
	var spec crashSpec
	if err := json.Unmarshal([]byte(os.Getenv(crashChildEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	var (
		handle *sql.DB
		drv    *driver.SQLDriver
		err    error
	)
	switch spec.Dialect {
	case "sqlite":
		handle, err = sqlite.Open(spec.URL)
		if err == nil {
			drv = sqlite.New(handle)
		}
	case "postgres":
		handle, err = sql.Open("pgx", spec.URL)
		if err == nil {
			drv = postgres.NewSQL(handle)
		}
	case "mysql":
		handle, err = mysql.Open(spec.URL)
		if err == nil {
			drv = mysql.New(handle)
		}
	default:
		err = fmt.Errorf("dialect %q", spec.Dialect)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	keys, err := idempotency.New(drv, idempotency.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	app := &widgets[*sql.Tx]{db: testDB[*sql.Tx]{drv: drv, dialect: spec.Dialect}, keys: keys}
	app.out = outbox.NewWriter(drv)
	app.beforeCommit = func() {
		fmt.Println("before commit")
		time.Sleep(time.Hour) // until killed
	}
	req := httptest.NewRequest(http.MethodPost, "/widgets", strings.NewReader(spec.Body))
	req.Header.Set(idempotency.HeaderKey, spec.Key)
	h := app.handler()
	if spec.Tx {
		h = app.txHandler()
	}
	h.ServeHTTP(httptest.NewRecorder(), req)
	fmt.Fprintln(os.Stderr, "crash child: the request ended; it should have stopped before its commit")
	return 2
}
