package testamqp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/procstat"
	"github.com/idem-go/idem/internal/testtls"
)

// BinDirEnv names the variable that may hold the directory of the RabbitMQ
// scripts (rabbitmq-server, rabbitmqctl); it defaults to
// /usr/lib/rabbitmq/bin, where Debian's rabbitmq-server package (which make
// test installs) puts them.
const BinDirEnv = "IDEM_TEST_RABBITMQ_BINDIR"

// Cluster is a RabbitMQ cluster of a test package's own: N nodes
// (rabbitmq-server processes) on 127.0.0.1 with their own names, AMQP and
// distribution ports, data and log directories, one private epmd and one
// Erlang cookie, all under one directory. It never touches the shared test
// node nor the system's RabbitMQ (ports 5672/25672, epmd 4369).
//
// The nodes run as the user running the tests (as root, like the node of
// scripts/lib/rabbitmq.sh; the scripts of /usr/lib/rabbitmq/bin are called
// directly, not Debian's /usr/sbin wrappers, which switch to the rabbitmq
// user and its cookie). Starting a 3-node cluster takes 30 to 60 s on a
// 2-core machine (a node's restart about 8 s), so a test package starts
// one for all its tests (NewCluster, closed in TestMain) and its tests use
// fresh queue names (Name).
//
// Its methods take the calling test and fail it on error.
type Cluster struct {
	dir, bin string
	tls      *testtls.PKI
	epmdPort int
	epmd     *exec.Cmd
	nodes    []*clusterNode
	env      []string // common to every node and CLI call
	claims   []string // port claim files, removed by Close
}

// clusterNode is one node of a Cluster.
type clusterNode struct {
	name       string
	port, dist int
	tlsPort    int // 0 without TLS
	dir        string

	mu   sync.Mutex
	cmd  *exec.Cmd     // the rabbitmq-server script; nil when stopped
	done chan struct{} // closed when cmd has exited
}

// ClusterOptions say how NewClusterWith configures the nodes.
type ClusterOptions struct {
	// TLS, when set, gives each node a TLS listener besides its AMQP one
	// (TLSURL), with the PKI's server certificate, that verifies clients
	// against the PKI's CA and refuses a client without a certificate
	// (ssl_options.verify = verify_peer, fail_if_no_peer_cert = true).
	TLS *testtls.PKI
}

// StartCluster starts a cluster of n nodes for one test and stops it when
// the test ends. Prefer one cluster per package (NewCluster in TestMain).
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterWith(t, n, ClusterOptions{})
}

// StartClusterWith is StartCluster with options.
func StartClusterWith(t testing.TB, n int, o ClusterOptions) *Cluster {
	t.Helper()
	c, err := NewClusterWith(n, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// NewCluster starts n RabbitMQ nodes, joins nodes 1..n-1 to node 0
// (rabbitmqctl stop_app, join_cluster, start_app) and returns once the
// cluster runs. Close stops and removes it. Its directory is under
// IDEM_TEST_DIR when set (so that scripts/test.sh sweeps what a killed test
// leaves), else under the system's temporary directory; the clusters that
// killed test processes left behind are removed first.
func NewCluster(n int) (*Cluster, error) { return NewClusterWith(n, ClusterOptions{}) }

// NewClusterWith is NewCluster with options.
func NewClusterWith(n int, o ClusterOptions) (c *Cluster, err error) {
	if n < 1 {
		return nil, fmt.Errorf("testamqp: NewCluster(%d): want at least one node", n)
	}
	bin := os.Getenv(BinDirEnv)
	if bin == "" {
		bin = "/usr/lib/rabbitmq/bin"
	}
	if _, err := os.Stat(filepath.Join(bin, "rabbitmq-server")); err != nil {
		return nil, fmt.Errorf("testamqp: no RabbitMQ in %s (%v): run the tests with `make test`, which installs rabbitmq-server, or set %s", bin, err, BinDirEnv)
	}
	parent := os.Getenv("IDEM_TEST_DIR")
	if parent == "" {
		parent = os.TempDir()
	}
	sweepStaleClusters(parent)
	dir, err := os.MkdirTemp(parent, clusterDirPrefix)
	if err != nil {
		return nil, err
	}
	c = &Cluster{dir: dir, bin: bin, tls: o.TLS}
	defer func() {
		if err != nil {
			_ = c.Close()
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(processID(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	if err := c.configure(n); err != nil {
		return nil, err
	}
	if err := c.startEpmd(); err != nil {
		return nil, err
	}
	for i := range c.nodes {
		if err := c.spawn(i); err != nil {
			return nil, err
		}
	}
	for i := range c.nodes {
		if err := c.awaitStartup(i, 3*time.Minute); err != nil {
			return nil, err
		}
	}
	for i := 1; i < n; i++ {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", c.nodes[0].name}, {"start_app"}} {
			if _, err := c.ctl(i, 2*time.Minute, args...); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// clusterDirPrefix starts the name of every cluster's directory.
const clusterDirPrefix = "idem-rabbit-cluster-"

// configure writes the configuration and picks the names and ports.
func (c *Cluster) configure(n int) error {
	home := filepath.Join(c.dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return err
	}
	cookie := make([]byte, 16)
	_, _ = rand.Read(cookie)
	if err := os.WriteFile(filepath.Join(home, ".erlang.cookie"), []byte(strings.ToUpper(hex.EncodeToString(cookie))), 0o400); err != nil {
		return err
	}
	files := map[string]string{
		"enabled_plugins":   "[].\n",
		"advanced.config":   "[].\n",
		"rabbitmq-env.conf": "",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(c.dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	perNode := 2
	if c.tls != nil {
		perNode = 3
	}
	ports, claims, err := freePorts(1 + perNode*n)
	c.claims = claims
	// For sweepStaleClusters, should this process be killed.
	_ = os.WriteFile(filepath.Join(c.dir, "claims"), []byte(strings.Join(claims, "\n")), 0o644)
	if err != nil {
		return err
	}
	c.epmdPort = ports[0]
	c.env = []string{
		"HOME=" + home,
		"ERL_EPMD_PORT=" + strconv.Itoa(c.epmdPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_ADVANCED_CONFIG_FILE=" + filepath.Join(c.dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(c.dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(c.dir, "enabled_plugins"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"IDEM_TEST_CLUSTER_DIR=" + c.dir, // marks our processes (sweep_servers)
	}
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	for i := range n {
		nd := &clusterNode{
			name: fmt.Sprintf("idemc%s-%d@localhost", hex.EncodeToString(id), i),
			port: ports[1+perNode*i],
			dist: ports[2+perNode*i],
			dir:  filepath.Join(c.dir, fmt.Sprintf("node%d", i)),
		}
		for _, d := range []string{"mnesia", "log"} {
			if err := os.MkdirAll(filepath.Join(nd.dir, d), 0o755); err != nil {
				return err
			}
		}
		conf := []string{
			"# Generated by internal/testamqp for one node of a test cluster.",
			"loopback_users.guest = true",
			"log.console = false",
			"log.file.level = info",
			"disk_free_limit.absolute = 50MB",
			// What production clusters of three or more nodes run: the
			// minority side of a partition pauses.
			"cluster_partition_handling = pause_minority",
		}
		if c.tls != nil {
			nd.tlsPort = ports[3+perNode*i]
			conf = append(conf,
				"listeners.ssl.default = 127.0.0.1:"+strconv.Itoa(nd.tlsPort),
				"ssl_options.cacertfile = "+c.tls.CA,
				"ssl_options.certfile = "+c.tls.ServerCert,
				"ssl_options.keyfile = "+c.tls.ServerKey,
				"ssl_options.verify = verify_peer",
				"ssl_options.fail_if_no_peer_cert = true",
			)
		}
		if err := os.WriteFile(filepath.Join(nd.dir, "rabbitmq.conf"), []byte(strings.Join(conf, "\n")+"\n"), 0o644); err != nil {
			return err
		}
		c.nodes = append(c.nodes, nd)
	}
	return nil
}

// nodeEnv returns the environment of node i's server and CLI calls.
func (c *Cluster) nodeEnv(i int) []string {
	nd := c.nodes[i]
	env := append(os.Environ(), c.env...)
	return append(env,
		"RABBITMQ_NODENAME="+nd.name,
		"RABBITMQ_CONFIG_FILE="+filepath.Join(nd.dir, "rabbitmq.conf"),
		"RABBITMQ_NODE_PORT="+strconv.Itoa(nd.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(nd.dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(nd.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(nd.dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(nd.dir, "rabbitmq.pid"),
		"ERL_CRASH_DUMP="+filepath.Join(nd.dir, "log", "erl_crash.dump"),
	)
}

// startEpmd starts the cluster's own epmd, which every node registers with
// (nodes on one host find each other through one epmd).
func (c *Cluster) startEpmd() error {
	path, err := exec.LookPath("epmd")
	if err != nil {
		return fmt.Errorf("testamqp: epmd (Erlang) not found: %w", err)
	}
	cmd := exec.Command(path, "-port", strconv.Itoa(c.epmdPort), "-address", "127.0.0.1")
	cmd.Env = append(os.Environ(), c.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testamqp: start epmd: %w", err)
	}
	c.epmd = cmd
	_ = os.WriteFile(filepath.Join(c.dir, "epmd.pid"), []byte(processID(cmd.Process.Pid)), 0o644)
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.epmdPort)), time.Second)
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testamqp: epmd not listening on port %d: %w", c.epmdPort, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// spawn starts node i's rabbitmq-server without waiting.
func (c *Cluster) spawn(i int) error {
	nd := c.nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd != nil {
		return fmt.Errorf("testamqp: node %d (%s) is running", i, nd.name)
	}
	_ = os.Remove(filepath.Join(nd.dir, "rabbitmq.pid"))
	logf, err := os.OpenFile(filepath.Join(nd.dir, "log", "startup.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(c.bin, "rabbitmq-server"))
	cmd.Env = c.nodeEnv(i)
	cmd.Dir = nd.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: Close kills the script, beam.smp and their
	// helpers at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testamqp: start node %s: %w", nd.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	nd.cmd, nd.done = cmd, done
	return nil
}

// awaitStartup waits until node i's broker runs.
func (c *Cluster) awaitStartup(i int, timeout time.Duration) error {
	nd := c.nodes[i]
	deadline := time.Now().Add(timeout)
	for {
		// await_startup fails at once while the node is not registered yet.
		_, err := c.ctl(i, 30*time.Second, "-q", "await_startup", "--timeout", "30")
		if err == nil {
			return nil
		}
		nd.mu.Lock()
		done := nd.done
		nd.mu.Unlock()
		select {
		case <-done:
			return fmt.Errorf("testamqp: node %s exited during start-up:\n%s", nd.name, c.logTail(i))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testamqp: node %s not ready after %v: %v\n%s", nd.name, timeout, err, c.logTail(i))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// logTail returns the end of node i's start-up log.
func (c *Cluster) logTail(i int) string {
	b, _ := os.ReadFile(filepath.Join(c.nodes[i].dir, "log", "startup.log"))
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// ctl runs rabbitmqctl against node i and returns its standard output.
func (c *Cluster) ctl(i int, timeout time.Duration, args ...string) (string, error) {
	return c.cli(i, "rabbitmqctl", timeout, args...)
}

// cli runs a RabbitMQ CLI tool (rabbitmqctl, rabbitmq-queues,
// rabbitmq-diagnostics) against node i.
func (c *Cluster) cli(i int, tool string, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, tool), append([]string{"-n", c.nodes[i].name}, args...)...)
	cmd.Env = c.nodeEnv(i)
	cmd.Dir = c.nodes[i].dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("testamqp: %s -n %s %s: %w\n%s%s", tool, c.nodes[i].name, strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.String(), nil
}

// Size returns the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// URL returns the cluster's URL with every node listed,
// amqp://guest:guest@127.0.0.1:P0,127.0.0.1:P1,.../ (see
// amqp.ConnConfig.URL).
func (c *Cluster) URL() string {
	hosts := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(nd.port)
	}
	return "amqp://guest:guest@" + strings.Join(hosts, ",") + "/"
}

// NodeURL returns the URL of node i alone.
func (c *Cluster) NodeURL(i int) string {
	return "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(c.nodes[i].port) + "/"
}

// TLSURL returns the URL of node i's TLS listener (ClusterOptions.TLS),
// amqps://guest:guest@127.0.0.1:PORT/ with the PKI's CA and client
// certificate (cacertfile, certfile, keyfile).
func (c *Cluster) TLSURL(i int) string {
	if c.tls == nil {
		panic("testamqp: TLSURL of a cluster started without ClusterOptions.TLS")
	}
	return "amqps://guest:guest@127.0.0.1:" + strconv.Itoa(c.nodes[i].tlsPort) + "/?" + neturl.Values{
		"cacertfile": {c.tls.CA}, "certfile": {c.tls.ClientCert}, "keyfile": {c.tls.ClientKey}}.Encode()
}

// NodeName returns node i's Erlang node name (name@localhost).
func (c *Cluster) NodeName(i int) string { return c.nodes[i].name }

// Port returns node i's AMQP port.
func (c *Cluster) Port(i int) int { return c.nodes[i].port }

// NodeOf returns the index of the node named name (as rabbitmqctl shows
// it), or -1.
func (c *Cluster) NodeOf(name string) int {
	for i, nd := range c.nodes {
		if nd.name == name {
			return i
		}
	}
	return -1
}

// Pid returns the process id of node i's Erlang VM (beam.smp), from the
// pid file the node writes once it runs.
func (c *Cluster) Pid(t testing.TB, i int) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.nodes[i].dir, "rabbitmq.pid"))
	if err != nil {
		t.Fatalf("testamqp: node %s: no pid file (is it running?): %v", c.nodes[i].name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("testamqp: node %s: pid file: %v", c.nodes[i].name, err)
	}
	return pid
}

// Kill kills node i's Erlang VM with SIGKILL (kill -9) and waits until it
// is gone: no shutdown, connections reset, the other nodes see it down.
func (c *Cluster) Kill(t testing.TB, i int) {
	t.Helper()
	c.signal(t, i, syscall.SIGKILL)
	c.waitExit(t, i, 30*time.Second)
	_ = os.Remove(filepath.Join(c.nodes[i].dir, "rabbitmq.pid"))
}

// Freeze stops node i's Erlang VM with SIGSTOP: its sockets stay open but
// nothing answers, as with a VM paused by its hypervisor. Thaw resumes it.
// Freeze returns once every thread of the VM is stopped.
func (c *Cluster) Freeze(t testing.TB, i int) {
	t.Helper()
	c.signal(t, i, syscall.SIGSTOP)
	if err := procstat.WaitStopped(c.Pid(t, i), 30*time.Second); err != nil {
		t.Fatalf("testamqp: freeze node %s: %v", c.nodes[i].name, err)
	}
}

// Thaw resumes node i after Freeze (SIGCONT).
func (c *Cluster) Thaw(t testing.TB, i int) { t.Helper(); c.signal(t, i, syscall.SIGCONT) }

func (c *Cluster) signal(t testing.TB, i int, sig syscall.Signal) {
	t.Helper()
	pid := c.Pid(t, i)
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("testamqp: signal %v to node %s (pid %d): %v", sig, c.nodes[i].name, pid, err)
	}
}

// waitExit waits until node i's rabbitmq-server has exited.
func (c *Cluster) waitExit(t testing.TB, i int, timeout time.Duration) {
	t.Helper()
	nd := c.nodes[i]
	nd.mu.Lock()
	cmd, done := nd.cmd, nd.done
	nd.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
	case <-time.After(timeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Errorf("testamqp: node %s did not exit within %v; killed", nd.name, timeout)
	}
	nd.mu.Lock()
	nd.cmd, nd.done = nil, nil
	nd.mu.Unlock()
}

// Start starts node i again (after Kill or Stop) with its data, and waits
// until it runs; it rejoins the cluster by itself.
func (c *Cluster) Start(t testing.TB, i int) {
	t.Helper()
	if err := c.spawn(i); err != nil {
		t.Fatal(err)
	}
	if err := c.awaitStartup(i, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// Restart starts node i again after Kill or Stop; a running node is
// stopped first (gracefully).
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	c.Stop(t, i)
	c.Start(t, i)
}

// Stop stops node i gracefully (rabbitmqctl stop) and waits until its
// process has exited. Does nothing if it is not running.
func (c *Cluster) Stop(t testing.TB, i int) {
	t.Helper()
	nd := c.nodes[i]
	nd.mu.Lock()
	running := nd.cmd != nil
	nd.mu.Unlock()
	if !running {
		return
	}
	if _, err := c.ctl(i, 2*time.Minute, "-q", "stop"); err != nil {
		t.Logf("testamqp: %v; killing it", err)
		c.signal(t, i, syscall.SIGKILL)
	}
	c.waitExit(t, i, 2*time.Minute)
}

// StopAll stops every node gracefully, all at once, and waits until every
// process has exited.
func (c *Cluster) StopAll(t testing.TB) {
	t.Helper()
	c.forEach(t, c.Stop)
}

// StartAll starts every stopped node, all at once (a node of a cluster
// that stopped waits at start-up for the others), and waits until all run.
func (c *Cluster) StartAll(t testing.TB) {
	t.Helper()
	for i, nd := range c.nodes {
		nd.mu.Lock()
		running := nd.cmd != nil
		nd.mu.Unlock()
		if !running {
			if err := c.spawn(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range c.nodes {
		if err := c.awaitStartup(i, 5*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
}

// forEach runs f for every node at once.
func (c *Cluster) forEach(t testing.TB, f func(testing.TB, int)) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(t, i)
		}()
	}
	wg.Wait()
}

// Ctl runs rabbitmqctl against node i (rabbitmqctl -n NODE args...) and
// returns its output.
func (c *Cluster) Ctl(t testing.TB, i int, args ...string) string {
	t.Helper()
	out, err := c.ctl(i, 2*time.Minute, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// CtlErr is Ctl returning the error instead of failing the test.
func (c *Cluster) CtlErr(i int, args ...string) (string, error) {
	return c.ctl(i, time.Minute, args...)
}

// QueueLeader returns the node that hosts the leader of quorum queue
// queue, as node i sees it, or -1 when it has none.
func (c *Cluster) QueueLeader(t testing.TB, i int, queue string) int {
	t.Helper()
	out := c.Ctl(t, i, "-q", "list_queues", "name", "leader", "--formatter", "json")
	var rows []struct {
		Name   string `json:"name"`
		Leader string `json:"leader"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("testamqp: list_queues: %v\n%s", err, out)
	}
	for _, r := range rows {
		if r.Name == queue {
			return c.NodeOf(r.Leader)
		}
	}
	t.Fatalf("testamqp: no queue %q on node %s", queue, c.nodes[i].name)
	return -1
}

// QuorumSafe reports whether every node may stop without leaving a quorum
// queue without a majority (rabbitmq-queues check_if_node_is_quorum_critical
// on each): every member of every quorum queue is back and in sync. Call it
// after Start, before killing another node.
func (c *Cluster) QuorumSafe(t testing.TB) bool {
	t.Helper()
	for i := range c.nodes {
		if _, err := c.cli(i, "rabbitmq-queues", time.Minute, "-q", "check_if_node_is_quorum_critical"); err != nil {
			return false
		}
	}
	return true
}

// Close kills every process of the cluster (nodes, their helpers, epmd)
// and removes its directory (kept, with the nodes' logs, when
// IDEM_TEST_KEEP=1).
func (c *Cluster) Close() error {
	var errs []error
	for _, nd := range c.nodes {
		nd.mu.Lock()
		cmd, done := nd.cmd, nd.done
		nd.cmd, nd.done = nil, nil
		nd.mu.Unlock()
		vm := ""
		if pid := readPid(filepath.Join(nd.dir, "rabbitmq.pid")); pid > 0 {
			vm = processID(pid)
			_ = syscall.Kill(pid, syscall.SIGCONT) // a frozen node
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if cmd != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				errs = append(errs, fmt.Errorf("testamqp: node %s: process %d did not exit", nd.name, cmd.Process.Pid))
			}
		}
		// The script may end before its VM is gone: SIGKILL takes effect
		// when the kernel has torn the process down.
		if vm != "" && !waitGone(vm, 30*time.Second) {
			errs = append(errs, fmt.Errorf("testamqp: node %s: Erlang VM %s still runs 30s after SIGKILL", nd.name, vm))
		}
	}
	if c.epmd != nil {
		_ = c.epmd.Process.Kill()
		_ = c.epmd.Wait()
	}
	for _, f := range c.claims {
		_ = os.Remove(f)
	}
	if os.Getenv("IDEM_TEST_KEEP") != "1" {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// processID returns "PID START" (start time in clock ticks since boot), to
// tell a live process from a recycled pid.
func processID(pid int) string { return strconv.Itoa(pid) + " " + startTime(pid) }

func startTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	if k := strings.LastIndexByte(s, ')'); k >= 0 {
		if f := strings.Fields(s[k+1:]); len(f) > 19 {
			return f[19]
		}
	}
	return ""
}

// alive reports whether the process id written by processID still runs.
func alive(id string) bool {
	f := strings.Fields(id)
	if len(f) != 2 {
		return false
	}
	pid, err := strconv.Atoi(f[0])
	return err == nil && startTime(pid) == f[1]
}

// waitGone waits until the process id written by processID has ended (a
// zombie counts as ended) or timeout passes, and reports whether it ended.
func waitGone(id string, timeout time.Duration) bool {
	pid, _ := strconv.Atoi(strings.Fields(id)[0])
	for deadline := time.Now().Add(timeout); ; {
		if !alive(id) {
			return true
		}
		if p, err := procstat.Read(pid); err == nil && (p.State == "Z" || p.State == "X") {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.Fields(string(b) + " 0")[0])
	return pid
}

// sweepStaleClusters kills the processes of the clusters under parent whose
// test process is gone (killed), and removes their directories.
func sweepStaleClusters(parent string) {
	dirs, _ := filepath.Glob(filepath.Join(parent, clusterDirPrefix+"*"))
	for _, dir := range dirs {
		owner, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil || alive(string(owner)) {
			continue
		}
		nodes, _ := filepath.Glob(filepath.Join(dir, "node*", "rabbitmq.pid"))
		for _, p := range nodes {
			if pid := readPid(p); pid > 0 && cmdlineHas(pid, dir) {
				_ = syscall.Kill(pid, syscall.SIGCONT)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, "epmd.pid")); err == nil && alive(string(b)) {
			_ = syscall.Kill(readPid(filepath.Join(dir, "epmd.pid")), syscall.SIGKILL)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "claims")); err == nil {
			for _, f := range strings.Fields(string(b)) {
				_ = os.Remove(f)
			}
		}
		_ = os.RemoveAll(dir)
	}
}

// cmdlineHas reports whether process pid's command line contains s.
func cmdlineHas(pid int, s string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && bytes.Contains(b, []byte(s))
}

// freePorts returns n distinct ports free on 127.0.0.1, below the kernel's
// ephemeral range (so that no client socket takes one while its node is
// down for a restart), and not claimed by a run of scripts/test.sh
// (/tmp/idem-test-ports); they are claimed for this run when IDEM_TEST_DIR
// is set, and released at its end.
func freePorts(n int) (ports []int, claimed []string, err error) {
	claims := filepath.Join(os.TempDir(), "idem-test-ports")
	owner := os.Getenv("IDEM_TEST_DIR")
	seen := map[int]bool{}
	for tries := 0; len(ports) < n; tries++ {
		if tries > 5000 {
			return nil, claimed, errors.New("testamqp: no free port found in 20000-32767")
		}
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		port := 20000 + int(binary.BigEndian.Uint16(b))%12768
		if seen[port] {
			continue
		}
		seen[port] = true
		if _, err := os.Stat(filepath.Join(claims, strconv.Itoa(port))); err == nil {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		_ = l.Close()
		if owner != "" {
			f := filepath.Join(claims, strconv.Itoa(port))
			if os.WriteFile(f, []byte(owner+"\n"), 0o644) == nil {
				claimed = append(claimed, f)
			}
		}
		ports = append(ports, port)
	}
	return ports, claimed, nil
}
