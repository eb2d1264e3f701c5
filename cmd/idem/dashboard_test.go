package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// lockedWriter is a buffer written by the command's goroutine.
type lockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func TestDashboardUsage(t *testing.T) {
	t.Parallel()
	nopass := filepath.Join(t.TempDir(), "basic")
	if err := os.WriteFile(nopass, []byte("nopass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"dashboard"}, "no database: pass --db URL"},
		{[]string{"dashboard", "--db", "postgres://x", "--http", "0.0.0.0:8090"}, "listens beyond loopback without authentication: give --auth-token-file FILE (or set $IDEM_DASHBOARD_TOKEN)"},
		{[]string{"dashboard", "--db", "postgres://x", "--http", ":8090"}, "--basic-auth-file FILE; or give --insecure-no-auth"},
		{[]string{"dashboard", "--db", "postgres://x", "--basic-auth-file", nopass}, "--basic-auth-file (or $IDEM_DASHBOARD_BASIC_AUTH): want USER:PASS"},
		{[]string{"dashboard", "--db", "postgres://x", "--token", "T"}, "flag provided but not defined: -token"},
		{[]string{"dashboard", "--db", "postgres://x", "--db-file", nopass}, "--db and --db-file both given"},
		{[]string{"dashboard", "--db", "postgres://x", "extra"}, "unexpected arguments"},
		{[]string{"dashboard", "--db", "postgres://x", "--broker", "nats://embedded?dir=/tmp/x"}, "only reachable from its own process"},
	} {
		code, _, errOut := idem(t, nil, "", tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("idem %v = %d %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	code, out, _ := idem(t, nil, "", "help", "dashboard")
	for _, want := range []string{"--read-only", "--auth-token-file", "--basic-auth-file", "--insecure-no-auth", "--broker", "--db-file", "search_path", "Examples:", "CSRF"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("help dashboard = %d, lacks %q", code, want)
		}
	}
}

// serveDashboard runs "idem dashboard" with args until the test ends (or
// stop is called, as SIGTERM would) and returns its base URL.
func serveDashboard(t *testing.T, environ map[string]string, args ...string) (base string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &lockedWriter{}, &lockedWriter{}
	e := &env{stdout: out, stderr: errOut, stdin: strings.NewReader(""), getenv: func(k string) string { return environ[k] }}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, e, append([]string{"dashboard", "--http", "127.0.0.1:0", "--sample", "100ms"}, args...))
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("idem dashboard exited %d\n%s", code, errOut.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the dashboard did not stop when its context ended")
		}
		if !strings.Contains(errOut.String(), "dashboard stopped") {
			t.Errorf("no stop line in the log:\n%s", errOut.String())
		}
	}
	t.Cleanup(stop)
	testsvc.WaitFor(t, 30*time.Second, "the dashboard's address", func() bool {
		m := regexp.MustCompile(`serving (http://\S+/) `).FindStringSubmatch(out.String())
		if m != nil {
			base = m[1]
		}
		select {
		case code := <-done:
			t.Fatalf("idem dashboard exited %d\n%s", code, errOut.String())
		default:
		}
		return m != nil
	})
	return base, stop
}

func getPage(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestDashboardServes runs "idem dashboard" over two databases until its
// context ends, as SIGTERM ends it.
func TestDashboardServes(t *testing.T) {
	t.Parallel()
	stock, billing := testdb.NewPostgres(t), testdb.NewPostgres(t)
	stock.Exec(t, `INSERT INTO failed_message (consumer_name, source, body, error, attempts, first_failed_at, failed_at)
VALUES ('stock', 'stock.events', 'not json', 'undecodable', 1, now(), now())`)
	base, stop := serveDashboard(t, map[string]string{"IDEM_DASHBOARD_TOKEN": "s3cret"},
		"--db", "stock="+stock.URL, "--db", billing.URL, "--read-only")
	if code, _ := getPage(t, base+"messages", ""); code != http.StatusUnauthorized {
		t.Errorf("without the token ($IDEM_DASHBOARD_TOKEN): %d, want 401", code)
	}
	code, page := getPage(t, base+"messages?db=stock", "s3cret")
	if code != http.StatusOK || !strings.Contains(page, "undecodable") || strings.Contains(page, `id="remove"`) {
		t.Errorf("messages: %d\n%s", code, page)
	}
	code, page = getPage(t, base, "s3cret")
	// The second database is named after its URL: database and schema.
	if code != http.StatusOK || !strings.Contains(page, `id="db-stock"`) || !strings.Contains(page, "."+billing.Schema) || !strings.Contains(page, "read-only") {
		t.Errorf("overview: %d\n%s", code, page)
	}
	stop()

	// One URL, two schemas: a dashboard database each, named after them.
	base, _ = serveDashboard(t, nil, "--db", testdb.PostgresURL(t), "--schema", stock.Schema+","+billing.Schema)
	code, page = getPage(t, base, "")
	if code != http.StatusOK || !strings.Contains(page, `id="db-`+stock.Schema+`"`) || !strings.Contains(page, `id="db-`+billing.Schema+`"`) {
		t.Errorf("overview with --schema: %d\n%s", code, page)
	}
	code, page = getPage(t, base+"messages?db="+stock.Schema, "")
	if code != http.StatusOK || !strings.Contains(page, "undecodable") || !strings.Contains(page, "data-id=") {
		t.Errorf("messages with --schema: %d\n%s", code, page)
	}
}
