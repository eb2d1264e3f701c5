// Package testnatscluster runs a NATS JetStream cluster of real nats-server
// processes for tests: three servers (or more) on free loopback ports, each
// with its own store directory, server name and routes to the others, which
// a test can kill (SIGKILL), restart, freeze (SIGSTOP) and thaw (SIGCONT).
//
// The nats-server binary is built once from the module in go.mod (go build
// github.com/nats-io/nats-server/v2) into os.TempDir()/idem-nats-server-<version>
// and shared by every test process of the machine.
//
//	c := testnatscluster.Start(t, testnatscluster.Config{})
//	pub, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{URL: c.URL()},
//		Stream: nats.StreamConfig{Replicas: 3}})
//	c.Kill(c.StreamLeader(t, "EVENTS"))
package testnatscluster

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/procstat"
)

// module is the module path of the server.
const module = "github.com/nats-io/nats-server/v2"

// Config configures a cluster.
type Config struct {
	// Servers is the number of servers. Defaults to 3.
	Servers int
	// SyncAlways makes each server sync every message to disk before it
	// acknowledges it (jetstream.sync_interval: always).
	SyncAlways bool
	// ReadyTimeout bounds the wait for the cluster (and each restarted
	// server) to be healthy. Defaults to 60s.
	ReadyTimeout time.Duration
}

// Cluster is a running cluster. Its methods fail the test on error; call
// them from the test's goroutine.
type Cluster struct {
	t       testing.TB
	cfg     Config
	bin     string
	servers []*server
}

type server struct {
	name       string
	dir        string
	conf       string
	logPath    string
	clientPort int
	routePort  int
	httpPort   int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	frozen bool
}

// Start builds the server binary if needed, starts the servers, waits until
// the cluster is healthy (every server up, a JetStream meta leader elected)
// and kills every server when the test ends.
func Start(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	cfg.Servers = cmp.Or(cfg.Servers, 3)
	cfg.ReadyTimeout = cmp.Or(cfg.ReadyTimeout, 60*time.Second)
	c := &Cluster{t: t, cfg: cfg, bin: Binary(t)}
	root := t.TempDir()
	ports := freePorts(t, 3*cfg.Servers)
	for i := range cfg.Servers {
		s := &server{
			name:       fmt.Sprintf("n%d", i),
			dir:        filepath.Join(root, fmt.Sprintf("n%d", i)),
			clientPort: ports[3*i],
			routePort:  ports[3*i+1],
			httpPort:   ports[3*i+2],
		}
		s.conf = filepath.Join(root, s.name+".conf")
		s.logPath = filepath.Join(root, s.name+".log")
		c.servers = append(c.servers, s)
	}
	for _, s := range c.servers {
		if err := os.WriteFile(s.conf, []byte(c.config(s)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(c.killAll)
	for i := range c.servers {
		c.start(i)
	}
	c.WaitHealthy(t)
	c.waitMetaPeers(time.Now().Add(cfg.ReadyTimeout))
	return c
}

// waitMetaPeers waits until the meta leader sees every other server
// current and online (its /jsz meta_cluster). Every server answers its
// /healthz before that: a stream of 3 replicas created then can fail with
// "no suitable peers for placement, peer offline".
func (c *Cluster) waitMetaPeers(deadline time.Time) {
	c.t.Helper()
	for {
		for _, s := range c.servers {
			if metaPeersCurrent(s.httpPort, s.name, len(c.servers)-1) {
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("testnatscluster: no meta leader saw its %d peers current after %v", len(c.servers)-1, c.cfg.ReadyTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metaPeersCurrent reports whether the server name, at httpPort, leads
// the meta group and sees its peers, all current and online.
func metaPeersCurrent(httpPort int, name string, peers int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/jsz", httpPort), nil)
	if err != nil {
		return false
	}
	resp, err := monitor.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var jsz struct {
		Meta *struct {
			Leader   string `json:"leader"`
			Replicas []struct {
				Current bool `json:"current"`
				Offline bool `json:"offline"`
			} `json:"replicas"`
		} `json:"meta_cluster"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil || jsz.Meta == nil || jsz.Meta.Leader != name || len(jsz.Meta.Replicas) != peers {
		return false
	}
	for _, p := range jsz.Meta.Replicas {
		if !p.Current || p.Offline {
			return false
		}
	}
	return true
}

// config returns the configuration file of s.
func (c *Cluster) config(s *server) string {
	var routes []string
	for _, o := range c.servers {
		if o != s {
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.routePort))
		}
	}
	syncLine := ""
	if c.cfg.SyncAlways {
		syncLine = "\n  sync_interval: always"
	}
	return fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream {
  store_dir: %q
  max_memory_store: 64MB
  max_file_store: 1GB%s
}
cluster {
  name: idemtest
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, s.name, s.clientPort, s.httpPort, s.dir, syncLine, s.routePort, strings.Join(routes, ", "))
}

// Servers returns the number of servers.
func (c *Cluster) Servers() int { return len(c.servers) }

// URL returns the client URLs of every server, comma-separated, as nats.go
// (and nats.ConnConfig.URL) accept them.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.servers))
	for i := range c.servers {
		urls[i] = c.ServerURL(i)
	}
	return strings.Join(urls, ",")
}

// ServerURL returns the client URL of server i.
func (c *Cluster) ServerURL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.servers[i].clientPort)
}

// Name returns the server name of server i (as JetStream reports leaders).
func (c *Cluster) Name(i int) string { return c.servers[i].name }

// Index returns the index of the server called name, or -1.
func (c *Cluster) Index(name string) int {
	for i, s := range c.servers {
		if s.name == name {
			return i
		}
	}
	return -1
}

// start starts server i, which must not be running.
func (c *Cluster) start(i int) {
	c.t.Helper()
	s := c.servers[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		c.t.Fatalf("testnatscluster: server %s is already running", s.name)
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(c.bin, "-c", s.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own: a ^C of the test run does not reach it
	// first, and the cleanup kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		c.t.Fatalf("testnatscluster: start %s: %v", s.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	s.cmd, s.exited, s.frozen = cmd, exited, false
}

// signal sends sig to server i and, for SIGKILL and SIGTERM, waits for it to
// exit.
func (c *Cluster) signal(i int, sig syscall.Signal) {
	c.t.Helper()
	s := c.servers[i]
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		c.t.Fatalf("testnatscluster: server %s is not running", s.name)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("testnatscluster: signal %v to %s: %v", sig, s.name, err)
	}
	switch sig {
	case syscall.SIGKILL, syscall.SIGTERM:
		if sig == syscall.SIGTERM && s.isFrozen() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			c.t.Fatalf("testnatscluster: server %s did not exit on %v", s.name, sig)
		}
		s.mu.Lock()
		s.cmd, s.exited, s.frozen = nil, nil, false
		s.mu.Unlock()
	case syscall.SIGSTOP:
		s.mu.Lock()
		s.frozen = true
		s.mu.Unlock()
		if err := procstat.WaitStopped(cmd.Process.Pid, 30*time.Second); err != nil {
			c.t.Fatalf("testnatscluster: freeze %s: %v", s.name, err)
		}
	case syscall.SIGCONT:
		s.mu.Lock()
		s.frozen = false
		s.mu.Unlock()
	}
}

func (s *server) isFrozen() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.frozen
}

// Kill kills server i with SIGKILL (kill -9) and waits for it to exit. Its
// store directory is kept.
func (c *Cluster) Kill(i int) { c.t.Helper(); c.signal(i, syscall.SIGKILL) }

// Stop stops server i gracefully (SIGTERM) and waits for it to exit.
func (c *Cluster) Stop(i int) { c.t.Helper(); c.signal(i, syscall.SIGTERM) }

// Freeze suspends server i (SIGSTOP): its sockets stay open, it answers
// nothing, as a server stuck in a long pause or on a dead machine whose
// connections were not reset.
func (c *Cluster) Freeze(i int) { c.t.Helper(); c.signal(i, syscall.SIGSTOP) }

// Thaw resumes a frozen server (SIGCONT).
func (c *Cluster) Thaw(i int) { c.t.Helper(); c.signal(i, syscall.SIGCONT) }

// Running reports whether server i is running (frozen or not).
func (c *Cluster) Running(i int) bool {
	s := c.servers[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// StartServer starts server i again on its ports and store directory, and
// waits until it is healthy.
func (c *Cluster) StartServer(i int) {
	c.t.Helper()
	c.start(i)
	c.waitServerHealthy(i, time.Now().Add(c.cfg.ReadyTimeout))
}

// Restart kills server i (SIGKILL) if it is running, starts it again and
// waits until it is healthy.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if c.Running(i) {
		c.Kill(i)
	}
	c.StartServer(i)
}

// RestartMetaCurrent is Restart, but waits only until server i is current
// with the meta leader (/healthz?js-meta-only=true), its streams and
// consumers catching up in the background, for tests that fault the
// servers under a load of their own. Under consumers created and updated
// while the server restarts, nats-server can leave one of its consumers
// without its replica ("consumer node missing"), the restarted server
// unhealthy for minutes (more than 3 in one run) while the consumer runs
// on the other servers.
func (c *Cluster) RestartMetaCurrent(i int) {
	c.t.Helper()
	if c.Running(i) {
		c.Kill(i)
	}
	c.start(i)
	c.waitServerReady(i, "?js-meta-only=true", time.Now().Add(c.cfg.ReadyTimeout))
}

// StopAll stops every running server gracefully (SIGTERM), all at once.
func (c *Cluster) StopAll() {
	c.t.Helper()
	var wg sync.WaitGroup
	for _, s := range c.servers {
		s.mu.Lock()
		cmd, exited, frozen := s.cmd, s.exited, s.frozen
		s.mu.Unlock()
		if cmd == nil {
			continue
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if frozen {
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-exited:
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}()
	}
	wg.Wait()
	for _, s := range c.servers {
		s.mu.Lock()
		s.cmd, s.exited, s.frozen = nil, nil, false
		s.mu.Unlock()
	}
}

// KillAll kills every running server (SIGKILL) at once.
func (c *Cluster) KillAll() {
	c.t.Helper()
	for i := range c.servers {
		if c.Running(i) {
			c.Kill(i)
		}
	}
}

// StartAll starts every server that is not running and waits until the
// cluster is healthy.
func (c *Cluster) StartAll() {
	c.t.Helper()
	for i := range c.servers {
		if !c.Running(i) {
			c.start(i)
		}
	}
	c.WaitHealthy(c.t)
}

// killAll is the cleanup: SIGKILL to every server, frozen or not.
func (c *Cluster) killAll() {
	for _, s := range c.servers {
		s.mu.Lock()
		cmd, exited := s.cmd, s.exited
		s.cmd, s.exited = nil, nil
		s.mu.Unlock()
		if cmd == nil {
			continue
		}
		_ = cmd.Process.Kill()
		<-exited
	}
	if c.t.Failed() {
		for _, s := range c.servers {
			if b, err := os.ReadFile(s.logPath); err == nil {
				c.t.Logf("testnatscluster: last lines of %s's log:\n%s", s.name, tail(b, 30))
			}
		}
	}
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitHealthy waits until every running server that is not frozen reports
// itself healthy (its /healthz: JetStream enabled, a meta leader known,
// its streams and consumers current).
func (c *Cluster) WaitHealthy(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(c.cfg.ReadyTimeout)
	for i, s := range c.servers {
		if c.Running(i) && !s.isFrozen() {
			c.waitServerHealthy(i, deadline)
		}
	}
}

func (c *Cluster) waitServerHealthy(i int, deadline time.Time) {
	c.t.Helper()
	c.waitServerReady(i, "", deadline)
}

// waitServerReady waits until server i's /healthz, with query, answers
// 200.
func (c *Cluster) waitServerReady(i int, query string, deadline time.Time) {
	c.t.Helper()
	s := c.servers[i]
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz%s", s.httpPort, query)
	var last string
	for {
		last = healthz(url)
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("testnatscluster: server %s not healthy after %v: %s", s.name, c.cfg.ReadyTimeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// monitor is the client of the monitoring endpoints: no idle connections
// left behind (goleak).
var monitor = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// healthz returns "" when url answers 200, else what it answered.
func healthz(url string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := monitor.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return ""
	}
	return fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body))
}

// StreamLeader returns the index of the server leading stream (of the
// global account), asking the running servers' monitoring endpoints, and
// waits up to the ready timeout for one that is running and not frozen.
func (c *Cluster) StreamLeader(t testing.TB, stream string) int {
	t.Helper()
	return c.leader(t, stream, "")
}

// ConsumerLeader returns the index of the server leading the durable
// consumer of stream, as StreamLeader.
func (c *Cluster) ConsumerLeader(t testing.TB, stream, consumer string) int {
	t.Helper()
	return c.leader(t, stream, consumer)
}

func (c *Cluster) leader(t testing.TB, stream, consumer string) int {
	t.Helper()
	deadline := time.Now().Add(c.cfg.ReadyTimeout)
	for {
		for i, s := range c.servers {
			if !c.Running(i) || s.isFrozen() {
				continue
			}
			if name := leaderOf(s.httpPort, stream, consumer); name != "" {
				// The others name a dead or frozen leader until they
				// elect a new one.
				if j := c.Index(name); j >= 0 && c.Running(j) && !c.servers[j].isFrozen() {
					return j
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("testnatscluster: no leader of stream %s consumer %q after %v", stream, consumer, c.cfg.ReadyTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leaderOf asks one server's /jsz for the leader of stream, or of its
// durable consumer when consumer is set.
func leaderOf(httpPort int, stream, consumer string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://127.0.0.1:%d/jsz?streams=true&consumers=true", httpPort)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return ""
	}
	resp, err := monitor.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	type cluster struct {
		Leader string `json:"leader"`
	}
	var jsz struct {
		AccountDetails []struct {
			StreamDetail []struct {
				Name           string   `json:"name"`
				Cluster        *cluster `json:"cluster"`
				ConsumerDetail []struct {
					Name    string   `json:"name"`
					Cluster *cluster `json:"cluster"`
				} `json:"consumer_detail"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil {
		return ""
	}
	for _, a := range jsz.AccountDetails {
		for _, sd := range a.StreamDetail {
			if sd.Name != stream {
				continue
			}
			if consumer == "" {
				if sd.Cluster != nil {
					return sd.Cluster.Leader
				}
				return ""
			}
			for _, cd := range sd.ConsumerDetail {
				if cd.Name == consumer && cd.Cluster != nil {
					return cd.Cluster.Leader
				}
			}
		}
	}
	return ""
}

// freePorts returns n distinct TCP ports free at the time of the call.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary returns the path of the nats-server binary of the version in
// go.mod, building it (once per machine and version; a file lock serialises
// the test processes that race to build it).
func Binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() { binPath, binErr = build() })
	if binErr != nil {
		t.Fatalf("testnatscluster: build nats-server: %v", binErr)
	}
	return binPath
}

func build() (string, error) {
	version, err := serverVersion()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(os.TempDir(), "idem-nats-server-"+version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nats-server")
	lock, err := os.OpenFile(filepath.Join(dir, "build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	for {
		err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	tmp := bin + ".tmp"
	cmd := exec.Command("go", "build", "-o", tmp, module)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -o %s %s: %v\n%s", tmp, module, err, out)
	}
	return bin, os.Rename(tmp, bin)
}

// serverVersion returns the version of the server module this test binary
// was built with, or else the one go.mod requires.
func serverVersion() (string, error) {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == module {
				if d.Replace != nil {
					d = d.Replace
				}
				if d.Version != "" && d.Version != "(devel)" {
					return d.Version, nil
				}
			}
		}
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", module).Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w (run the tests inside the idem module)", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}
