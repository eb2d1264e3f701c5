package adminhttp_test

import (
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/adminhttp"
	"github.com/idem-go/idem/internal/adminhttp/adminhttptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Only loopback addresses pass; an empty host listens everywhere.
func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:9464": true, "localhost:9464": true, "[::1]:9464": true, "127.0.0.2:1": true,
		":9464": false, "0.0.0.0:9464": false, "192.168.1.4:9464": false, "example.com:80": false, "junk": false,
	} {
		if got := adminhttp.IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// Beyond loopback, an address needs a token or --insecure-no-auth, and
// the refusal says how to give either.
func TestCheck(t *testing.T) {
	t.Parallel()
	if err := adminhttp.Check("--metrics-addr", "127.0.0.1:9464", false, false, ""); err != nil {
		t.Errorf("loopback refused: %v", err)
	}
	if err := adminhttp.Check("--metrics-addr", ":9464", true, false, ""); err != nil {
		t.Errorf("authenticated refused: %v", err)
	}
	if err := adminhttp.Check("--metrics-addr", ":9464", false, true, ""); err != nil {
		t.Errorf("--insecure-no-auth refused: %v", err)
	}
	err := adminhttp.Check("--metrics-addr", "0.0.0.0:9464", false, false, "give --auth-token-file FILE")
	if err == nil || !strings.Contains(err.Error(), "--metrics-addr 0.0.0.0:9464 listens beyond loopback") ||
		!strings.Contains(err.Error(), "--insecure-no-auth") || !strings.Contains(err.Error(), "--auth-token-file") {
		t.Errorf("Check = %v", err)
	}
}

// start serves a server with flags args on a free loopback port, with a
// health check answering healthy and one handler at /metrics.
func start(t *testing.T, env map[string]string, healthy func() error, args ...string) *adminhttp.Server {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var f adminhttp.Flags
	f.Register(fs, "--metrics-addr", "T_TOKEN", true)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.Config("127.0.0.1:0", func(k string) string { return env[k] }, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := adminhttp.Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.HandleHealth(healthy)
	s.Handle("/metrics", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "metrics\n") }))
	s.Start()
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// get fetches path of s with token, and returns the status and the body.
func get(t *testing.T, s *adminhttp.Server, path, token string) (int, string) {
	t.Helper()
	code, answer := adminhttptest.Get(t, "http://"+s.Addr().String(), path, token)
	_, body, _ := strings.Cut(answer, "\r\n\r\n")
	return code, body
}

// With a token (from a file, or the variable), every path but /healthz
// needs it; /healthz tells the reason only to who carries it; the profiles
// answer when asked, without the command line.
func TestServerToken(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("t0ken-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sick := func() error { return errors.New("no claim since 30s: dial postgres://app:S3cret@db/shop") }
	for name, s := range map[string]*adminhttp.Server{
		"file":     start(t, nil, sick, "--auth-token-file", file, "--pprof"),
		"variable": start(t, map[string]string{"T_TOKEN": "t0ken-from-file"}, sick, "--pprof"),
	} {
		for _, path := range []string{"/metrics", "/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/cmdline", "/nothing"} {
			if code, _ := get(t, s, path, ""); code != http.StatusUnauthorized {
				t.Errorf("%s: GET %s without the token: %d, want 401", name, path, code)
			}
			if code, _ := get(t, s, path, "wrong"); code != http.StatusUnauthorized {
				t.Errorf("%s: GET %s with a wrong token: %d, want 401", name, path, code)
			}
		}
		if code, body := get(t, s, "/metrics", "t0ken-from-file"); code != http.StatusOK || body != "metrics\n" {
			t.Errorf("%s: /metrics with the token: %d %q", name, code, body)
		}
		if code, body := get(t, s, "/healthz", ""); code != http.StatusServiceUnavailable || body != "not ok\n" {
			t.Errorf("%s: /healthz without the token: %d %q, want 503 and no reason", name, code, body)
		}
		if code, body := get(t, s, "/healthz", "t0ken-from-file"); code != http.StatusServiceUnavailable ||
			!strings.Contains(body, "not ok: no claim since 30s") || strings.Contains(body, "S3cret") {
			t.Errorf("%s: /healthz with the token: %d %q, want the reason, redacted", name, code, body)
		}
		if code, _ := get(t, s, "/debug/pprof/cmdline", "t0ken-from-file"); code != http.StatusNotFound {
			t.Errorf("%s: /debug/pprof/cmdline: %d, want 404", name, code)
		}
		code, index := get(t, s, "/debug/pprof/", "t0ken-from-file")
		if code != http.StatusOK || strings.Contains(index, "cmdline") {
			t.Fatalf("%s: /debug/pprof/: %d\n%s", name, code, index)
		}
		links := regexp.MustCompile(`href="([^"]+)"`).FindAllStringSubmatch(index, -1)
		if len(links) < 6 {
			t.Fatalf("%s: the index links %d profiles:\n%s", name, len(links), index)
		}
		for _, l := range links {
			if strings.HasPrefix(l[1], "profile") || strings.HasPrefix(l[1], "trace") {
				continue // CPU profile and trace take seconds: their handlers are pprof's
			}
			if code, body := get(t, s, "/debug/pprof/"+l[1], "t0ken-from-file"); code != http.StatusOK || body == "" {
				t.Errorf("%s: %s: %d %.80q", name, l[1], code, body)
			}
		}
	}
}

// Without a token (loopback), everything answers; without --pprof there
// are no profiles; /healthz gives its reason.
func TestServerNoToken(t *testing.T) {
	t.Parallel()
	s := start(t, nil, func() error { return nil })
	if code, body := get(t, s, "/metrics", ""); code != http.StatusOK || body != "metrics\n" {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if code, body := get(t, s, "/healthz", ""); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline"} {
		if code, _ := get(t, s, path, ""); code != http.StatusNotFound {
			t.Errorf("GET %s without --pprof: %d, want 404", path, code)
		}
	}
}

// Listen refuses an address beyond loopback without a token or NoAuth,
// before listening; an empty or missing token file is an error.
func TestListenPolicy(t *testing.T) {
	t.Parallel()
	_, err := adminhttp.Listen(adminhttp.Config{Addr: "0.0.0.0:0", AddrFlag: "--admin-addr"})
	if err == nil || !strings.Contains(err.Error(), "--insecure-no-auth") {
		t.Errorf("Listen beyond loopback: %v", err)
	}
	s, err := adminhttp.Listen(adminhttp.Config{Addr: "0.0.0.0:0", AddrFlag: "--admin-addr", NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	empty := filepath.Join(t.TempDir(), "empty")
	_ = os.WriteFile(empty, nil, 0o600)
	f := adminhttp.Flags{TokenFile: empty}
	if _, err := f.Token(os.Getenv); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Errorf("empty token file: %v", err)
	}
}
