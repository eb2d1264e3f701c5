package main

// Process tests of guarantee G15, no secret leaves the process: idem relay,
// idem cdc and idem dashboard, built with go build and run as child
// processes with passwords in their --db and --broker URLs and a token,
// serve every path of their address to the token only, and neither their
// answers nor their output hold a password or the token.

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/adminhttp/adminhttptest"
	"github.com/idem-go/idem/internal/redact"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// secrets are the passwords and the token of a test, in the URLs and the
// file its processes are given.
type secrets struct {
	dbURL, brokerURL string
	tokenFile        string
	// all are the secrets: the database's and the broker's passwords and
	// the token.
	all []string
}

// newSecrets gives pg's URL a password (which the test server, trusting
// local connections, ignores), makes a RabbitMQ user with a password of
// its own (on an exchange of the test), and writes a token in a file.
func newSecrets(t *testing.T, pg *testdb.PG) secrets {
	t.Helper()
	dbURL, dbPassword := testdb.WithPassword(t, pg.URL)
	brokerURL, brokerPassword := testamqp.UserURL(t)
	token := "tok" + testamqp.Name("")
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return secrets{dbURL: dbURL, brokerURL: brokerURL + "?exchange=" + testamqp.Name("secrets_"), tokenFile: file,
		all: []string{dbPassword, brokerPassword, token}}
}

func (s secrets) token() string { return s.all[2] }

// beyondLoopback returns an address on every interface, on a port free at
// the time of the call, and the loopback URL to reach it.
func beyondLoopback(t *testing.T) (addr, base string) {
	t.Helper()
	_, port, _ := strings.Cut(freeAddr(t), ":")
	return "0.0.0.0:" + port, "http://127.0.0.1:" + port
}

// waitOutput waits until the process's output holds want, or it exited.
// A CDC relay creates its slot first, which waits for the transactions
// running on the shared test server: minutes, when it is busy.
func waitOutput(t *testing.T, p *cdcProc, want string) {
	t.Helper()
	testsvc.WaitFor(t, 3*time.Minute, p.name+" saying "+want, func() bool {
		if p.exited() {
			t.Fatalf("%s exited:\n%s", p.name, tail(p.out.String(), 4000))
		}
		return strings.Contains(p.out.String(), want)
	})
}

// stopAndCheck stops p with SIGTERM, checks a graceful exit, and checks
// its whole output for the secrets; the output must show want (a URL it
// logs, redacted), or the test would check nothing.
func stopAndCheck(t *testing.T, p *cdcProc, s secrets, want string) {
	t.Helper()
	p.stop(t)
	out := p.out.String()
	adminhttptest.NoSecret(t, p.name+"'s output", out, s.all...)
	if !strings.Contains(out, want) {
		t.Errorf("%s does not print %q: the test checks nothing\n%s", p.name, want, tail(out, 3000))
	}
}

// opsPaths are the paths of the ops address of idem relay and idem cdc:
// /healthz answers without the token, saying no more than ok or not ok.
func opsPaths(t *testing.T, base, token string) []adminhttptest.Path {
	paths := []adminhttptest.Path{
		{Path: "/metrics", Status: http.StatusOK},
		{Path: "/healthz", Status: http.StatusOK, Open: []string{"ok\n", "not ok\n"}},
		{Path: "/", Status: http.StatusNotFound},
		{Path: "/debug/pprof/symbol", Status: http.StatusOK},
	}
	return append(paths, adminhttptest.PprofPaths(t, base, token)...)
}

// TestSecretsRelay: idem relay with passwords in --db and --broker and a
// token, on an address beyond loopback with --pprof.
func TestSecretsRelay(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	checkOps(t, pg, "msg=relaying", "relay", "--poll-interval", "50ms")
}

// TestSecretsCDC: idem cdc on PostgreSQL, as TestSecretsRelay.
func TestSecretsCDC(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	dropSlotAtCleanup(t, pg)
	checkOps(t, pg, "replication started", "cdc", "--schema", pg.Schema, "--slot", cdcSlot(pg), "--prefix", cdcPrefix(pg))
}

// checkOps starts idem with args, secrets in its URLs and a token, on an
// ops address beyond loopback with --pprof; once it says ready, it checks
// every path of the address, then its output.
func checkOps(t *testing.T, pg *testdb.PG, ready string, args ...string) {
	t.Helper()
	s := newSecrets(t, pg)
	addr, base := beyondLoopback(t)
	p := startProc(t, "idem "+args[0], nil, append(args, "--db", s.dbURL, "--broker", s.brokerURL, "--metrics-addr", addr,
		"--auth-token-file", s.tokenFile, "--pprof", "--log-level", "debug")...)
	waitOutput(t, p, ready)
	adminhttptest.Check(t, base, s.token(), opsPaths(t, base, s.token()), s.all...)
	stopAndCheck(t, p, s, ":xxxxx@127.0.0.1")
}

// TestSecretsDashboard: idem dashboard with passwords in --db and --broker
// and a token, beyond loopback: every page, a parked message and its
// confirmation pages included.
func TestSecretsDashboard(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `INSERT INTO failed_message (consumer_name, source, body, error, attempts, first_failed_at, failed_at)
VALUES ('stock', 'stock.events', 'body', 'boom', 1, now(), now())`)
	var id int64
	if err := pg.Pool.QueryRow(context.Background(), `SELECT id FROM failed_message`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	s := newSecrets(t, pg)
	addr, base := beyondLoopback(t)
	p := startProc(t, "idem dashboard", nil, "dashboard", "--db", "main="+s.dbURL, "--broker", s.brokerURL, "--http", addr,
		"--auth-token-file", s.tokenFile, "--sample", "100ms", "--log-level", "debug")
	waitOutput(t, p, "idem dashboard: serving")
	msg := fmt.Sprintf("/messages/main/%d", id)
	adminhttptest.Check(t, base, s.token(), []adminhttptest.Path{
		{Path: "/", Status: http.StatusOK},
		{Path: "/status.json", Status: http.StatusOK},
		{Path: "/messages", Status: http.StatusOK},
		{Path: "/messages?db=main&consumer=stock", Status: http.StatusOK},
		{Path: msg, Status: http.StatusOK},
		{Path: msg + "/retry", Status: http.StatusOK},
		{Path: msg + "/remove", Status: http.StatusOK},
		{Path: "/bulk/main/retry?consumer=stock", Status: http.StatusOK},
		{Path: "/static/style.css", Status: http.StatusOK},
		{Path: "/nothing", Status: http.StatusNotFound},
		{Path: "/debug/pprof/cmdline", Status: http.StatusNotFound},
	}, s.all...)
	stopAndCheck(t, p, s, ":xxxxx@127.0.0.1")
}

// TestBeyondLoopbackRefused: an address beyond loopback without a token is
// refused at start, before anything is opened (the database here does not
// exist), with a message naming --insecure-no-auth; with it, the command
// starts and serves without a token.
func TestBeyondLoopbackRefused(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	dropSlotAtCleanup(t, pg)
	s := newSecrets(t, pg)
	for _, tc := range []struct {
		name, ready, path string
		args              []string
	}{
		{"relay", "serving /metrics", "/metrics", []string{"relay", "--broker", s.brokerURL, "--metrics-addr"}},
		{"cdc", "serving /metrics", "/metrics", []string{"cdc", "--broker", s.brokerURL, "--schema", pg.Schema, "--slot", cdcSlot(pg), "--prefix", cdcPrefix(pg), "--metrics-addr"}},
		{"dashboard", "idem dashboard: serving", "/status.json", []string{"dashboard", "--broker", s.brokerURL, "--http"}},
	} {
		addr, base := beyondLoopback(t)
		args := append(tc.args, addr)
		p := startProc(t, "idem "+tc.name+" (refused)", nil, append(args, "--db", "postgres://nobody:"+s.all[0]+"@127.0.0.1:1/none")...)
		<-p.done
		out := p.out.String()
		if code := p.cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(out, addr+" listens beyond loopback without authentication") ||
			!strings.Contains(out, "--insecure-no-auth") || !strings.Contains(out, "--auth-token-file") {
			t.Errorf("idem %s on %s without a token: exit %d, want 2 and a refusal naming --insecure-no-auth and --auth-token-file:\n%s", tc.name, addr, code, out)
		}
		adminhttptest.NoSecret(t, "idem "+tc.name+"'s refusal", out, s.all...)

		p = startProc(t, "idem "+tc.name+" (--insecure-no-auth)", nil, append(args, "--db", s.dbURL, "--insecure-no-auth")...)
		waitOutput(t, p, tc.ready)
		if code, body := adminhttptest.Get(t, base, tc.path, ""); code != http.StatusOK {
			t.Errorf("idem %s --insecure-no-auth: GET %s: %d\n%s", tc.name, tc.path, code, body)
		}
		// It may still be starting (a CDC relay creating its slot, which
		// SIGTERM cancels on the server, SIGKILL would not): any exit.
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(60 * time.Second):
			t.Errorf("%s still running 60s after SIGTERM", p.name)
		}
		adminhttptest.NoSecret(t, p.name+"'s output", p.out.String(), s.all...)
	}
}

// TestSecretsInErrorsAndStatus: idem status (text and JSON) and the errors
// of a database that cannot be reached, a URL that does not parse (whose
// url.Parse error quotes it whole) and a broker that refuses the password
// show no password.
func TestSecretsInErrorsAndStatus(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	s := newSecrets(t, pg)
	wrongBroker := strings.Replace(s.brokerURL, s.all[1], "wrong"+s.all[1][:4], 1)
	// The same database URL on a port nothing listens on, whatever port
	// the test server has.
	u, err := url.Parse(s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = "127.0.0.1:1"
	closedPort := u.String()
	for i, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"status", "--db", s.dbURL, "--broker", s.brokerURL}, 0, "outbox: backlog 0"},
		{[]string{"status", "--db", s.dbURL, "--broker", s.brokerURL, "--json"}, 0, `"database":"postgres://postgres:xxxxx@`},
		{[]string{"status", "--db", s.dbURL, "--broker", wrongBroker}, 1, ":xxxxx@127.0.0.1"},
		{[]string{"migrate", "status", "--db", closedPort}, 1, "postgres://postgres:xxxxx@127.0.0.1:1/"},
		{[]string{"migrate", "status", "--db", strings.Replace(s.dbURL, "@127.0.0.1:", "@127.0.0.1:x", 1)}, 1, "invalid port"},
		{[]string{"failed", "list", "--db", "postgres://postgres@127.0.0.1/x?password=" + s.all[0] + "&host=127.0.0.1&port=1"}, 1, "password=xxxxx"},
		{[]string{"relay", "--db", s.dbURL, "--broker", wrongBroker, "--metrics-addr", ""}, 1, ":xxxxx@127.0.0.1"},
	} {
		code, out, errOut := idem(t, nil, "", tc.args...)
		what := fmt.Sprintf("case %d (idem %s)", i, strings.Join(tc.args[:2], " "))
		adminhttptest.NoSecret(t, what+" output", out+errOut, s.all...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%s = %d, want %d and %q:\n%s%s", what, code, tc.code, tc.want, out, errOut)
		}
	}
}

// TestHelpHasNoPassword: no example of any command's help puts a password
// on the command line (a URL with one, a password= parameter, a token
// value): they use variables and files.
func TestHelpHasNoPassword(t *testing.T) {
	t.Parallel()
	for _, c := range commands {
		for _, line := range strings.Split(c.usage, "\n") {
			if redact.String(line) != line || strings.Contains(line, "TOKEN=") {
				t.Errorf("idem help %s: a secret on a command line: %q", c.name, line)
			}
		}
	}
}
