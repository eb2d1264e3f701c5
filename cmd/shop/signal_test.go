package main

import (
	"bufio"
	"context"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestSignalDuringStartUp sends SIGTERM or SIGINT to the shop at several
// moments of its start-up, each on a fresh data directory, and checks that
// it stops as cleanly as after "ready": exit status 0, its HTTP address
// free again, and nothing left that stops the next start on the same data
// (a lock, a half-applied migration).
func TestSignalDuringStartUp(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		name  string
		after string // the line of output after which the signal is sent
		sig   syscall.Signal
	}{
		{"before the databases", "shop: starting", syscall.SIGTERM},
		{"during the first migrations", "msg=\"migration applied\" service=order", syscall.SIGTERM},
		{"during the last migrations, SIGINT", "msg=\"migration applied\" service=billing", syscall.SIGINT},
		{"opening the broker and the subscribers", "msg=\"migration applied\" service=carrier version=2", syscall.SIGTERM},
		{"starting the relays", "msg=\"relay started\"", syscall.SIGTERM},
		{"after ready", "shop: ready", syscall.SIGTERM},
	} {
		t.Run(m.name, func(t *testing.T) {
			dir := t.TempDir()
			addr, err := shopkit.FreeAddr()
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(shopBinary, "--data-dir", dir, "--http", addr, "--summary", "0", "--log-level", "info")
			out := startWatched(t, cmd)
			if !out.waitFor(m.after, 60*time.Second) {
				_ = cmd.Process.Kill()
				t.Fatalf("no line %q in 60s:\n%s", m.after, out)
			}
			if err := cmd.Process.Signal(m.sig); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case err := <-exited:
				if err != nil || cmd.ProcessState.ExitCode() != 0 {
					t.Fatalf("%v after the signal, want exit status 0:\n%s", err, out)
				}
			case <-time.After(40 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("still running 40s after the signal:\n%s", out)
			}
			if !strings.Contains(out.String(), "shop: stopped") {
				t.Errorf("no \"shop: stopped\" in the output:\n%s", out)
			}
			l, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatalf("the HTTP address is still taken after the exit: %v", err)
			}
			l.Close()
			if m.after == "shop: ready" {
				return // the end-to-end tests restart after this one
			}

			cl := &shopkit.Cluster{Binary: shopBinary, DataDir: dir, LogDir: t.TempDir()}
			t.Cleanup(cl.StopAll)
			p, err := cl.Start(context.Background(), shopkit.ProcSpec{Name: "restart", Services: "all", HTTP: addr})
			if err != nil {
				t.Fatalf("restart on the same data: %v", err)
			}
			if err := p.Stop(); err != nil {
				t.Fatalf("restart: SIGTERM after ready: %v\n%s", err, p.Tail())
			}
		})
	}
}

// watched is the output, stdout and stderr together, of a process.
type watched struct {
	mu    sync.Mutex
	b     strings.Builder
	lines chan string
}

// startWatched starts cmd and collects its output.
func startWatched(t *testing.T, cmd *exec.Cmd) *watched {
	t.Helper()
	w := &watched{lines: make(chan string, 1024)}
	cmd.Env = append(os.Environ(), "IDEM_FAULT=")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, r := range []io.Reader{stdout, stderr} {
		wg.Go(func() {
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				w.mu.Lock()
				w.b.WriteString(sc.Text() + "\n")
				w.mu.Unlock()
				select {
				case w.lines <- sc.Text():
				default:
				}
			}
		})
	}
	go func() { wg.Wait(); close(w.lines) }()
	return w
}

// waitFor waits for a line containing s.
func (w *watched) waitFor(s string, d time.Duration) bool {
	timeout := time.After(d)
	for {
		select {
		case l, ok := <-w.lines:
			if !ok {
				return false
			}
			if strings.Contains(l, s) {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

func (w *watched) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
