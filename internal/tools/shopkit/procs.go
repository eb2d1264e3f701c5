package shopkit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Cluster starts shop processes sharing one namespace on the same servers.
// Its settings are those of every process it starts; an empty one is left
// to the shop's default.
type Cluster struct {
	// Binary is the shop binary.
	Binary string
	// DB and Broker are the processes' --db and --broker: with neither,
	// the embedded defaults under DataDir.
	DB, Broker string
	// Namespace is the processes' --namespace.
	Namespace string
	// DataDir is the processes' --data-dir.
	DataDir string
	// LogDir receives each process's log (its stderr), a file per start.
	LogDir string
	// ExtraEnv is added to each process's environment.
	ExtraEnv []string
	// Relay and Outbox are the processes' --relay and --outbox.
	Relay, Outbox string

	mu    sync.Mutex
	procs []*Proc
	// started holds every process started, for Deaths.
	started []*Proc
}

// Proc is one running shop process.
type Proc struct {
	// Name names the process in errors and in its log file's name.
	Name string
	// HTTP is the address of its order API and fake carrier ("" for a
	// process that serves none).
	HTTP   string
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
	log    string
	stdout *LockedBuffer
	// fault is the fault point the process was armed with, if any.
	fault string
	// ended is set when the process was told to end (Kill, Stop): its exit
	// is expected.
	ended atomic.Bool
}

// LockedBuffer is a bytes.Buffer that several goroutines may write and
// read: a process's output while it runs.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// FreeAddr returns a local TCP address free at the time of the call.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// ProcSpec says how to start a process.
type ProcSpec struct {
	// Name names the process.
	Name string
	// Services is its --services.
	Services string
	// Fault, when set, is the fault point it dies at (IDEM_FAULT); the
	// binary must be built with the idemfault tag.
	Fault string
	// HTTP is its --http: an address to reuse (a restart); empty picks a
	// free one.
	HTTP string
	// CarrierURL is its --carrier-url, when set.
	CarrierURL string
}

// ErrExitedAtStart is returned (wrapped) for a process that exited before
// it was ready.
var ErrExitedAtStart = errors.New("exited before it was ready")

// Start starts a process and waits until it prints "shop: ready". For a
// process that exited before, it returns the process (its output) with an
// error wrapping ErrExitedAtStart.
func (c *Cluster) Start(ctx context.Context, spec ProcSpec) (*Proc, error) {
	addr := spec.HTTP
	if addr == "" {
		var err error
		if addr, err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	// Empty settings are left to the command's defaults: with no --db and
	// no --broker, the embedded ones under --data-dir.
	args := []string{"--services", spec.Services, "--http", addr, "--summary", "0",
		"--relay-lease", "2s", "--key-lock-timeout", "1s", "--log-level", "warn"}
	for _, f := range [][2]string{{"--db", c.DB}, {"--broker", c.Broker}, {"--namespace", c.Namespace}, {"--data-dir", c.DataDir}, {"--relay", c.Relay}, {"--outbox", c.Outbox}} {
		if f[1] != "" {
			args = append(args, f[0], f[1])
		}
	}
	if spec.CarrierURL != "" {
		args = append(args, "--carrier-url", spec.CarrierURL)
	}
	return c.Run(ctx, spec.Name, addr, spec.Fault, args)
}

// Run starts the shop binary with args (a command of its own, such as
// "broker", or the flags of a shop), and waits until it prints "shop:
// ready". addr is the process's HTTP address, if any; fault, when set, the
// fault point it dies at.
func (c *Cluster) Run(ctx context.Context, name, addr, fault string, args []string) (*Proc, error) {
	cmd := exec.Command(c.Binary, args...)
	cmd.Env = append(os.Environ(), c.ExtraEnv...)
	cmd.Env = append(cmd.Env, "IDEM_FAULT="+fault)
	logPath := fmt.Sprintf("%s/%s-%d.log", c.LogDir, name, time.Now().UnixNano())
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logFile
	out := &LockedBuffer{}
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	p := &Proc{Name: name, HTTP: addr, cmd: cmd, exited: make(chan struct{}), log: logPath, stdout: out, fault: fault}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pipe)
		once := sync.Once{}
		for sc.Scan() {
			fmt.Fprintln(out, sc.Text())
			if sc.Text() == "shop: ready" {
				once.Do(func() { close(ready) })
			}
		}
		_, _ = io.Copy(io.Discard, pipe)
	}()
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.started = append(c.started, p)
	c.mu.Unlock()
	t := time.NewTimer(60 * time.Second)
	defer t.Stop()
	select {
	case <-ready:
		return p, nil
	case <-p.exited:
		return p, fmt.Errorf("process %s %w: %v\n%s", name, ErrExitedAtStart, p.err, p.Tail())
	case <-t.C:
		p.Kill()
		return nil, fmt.Errorf("process %s not ready after 60s\n%s", name, p.Tail())
	case <-ctx.Done():
		p.Kill()
		return nil, ctx.Err()
	}
}

// Tail returns the last 3,000 bytes of the process's log.
func (p *Proc) Tail() string {
	b, _ := os.ReadFile(p.log)
	s := string(b)
	if len(s) > 3000 {
		s = s[len(s)-3000:]
	}
	return s
}

// LogText returns the process's whole log so far.
func (p *Proc) LogText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// Problems returns the last warnings and errors of the process's log, for
// failures that happened long before its tail.
func (p *Proc) Problems() string { return ProblemLines(p.LogText()) }

// Stdout returns what the process printed on its standard output so far.
func (p *Proc) Stdout() string { return p.stdout.String() }

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// ProblemLines returns the last 40 warnings and errors of log.
func ProblemLines(log string) string {
	var out []string
	for line := range strings.Lines(log) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			out = append(out, line)
		}
	}
	if len(out) > 40 {
		out = out[len(out)-40:]
	}
	return strings.Join(out, "")
}

// WaitKilled waits, at most d, until the process died at its fault point.
func (p *Proc) WaitKilled(d time.Duration) error {
	select {
	case <-p.exited:
		if !strings.Contains(p.Tail(), "fault point") {
			return fmt.Errorf("process %s exited without hitting its fault point: %v\n%s", p.Name, p.err, p.Tail())
		}
		return nil
	case <-time.After(d):
		return fmt.Errorf("process %s did not hit its fault point within %v", p.Name, d)
	}
}

// Stop sends SIGTERM and waits for a graceful exit; after 40 seconds it
// kills the process.
func (p *Proc) Stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	p.ended.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // in case it is frozen
	select {
	case <-p.exited:
		return p.err
	case <-time.After(40 * time.Second):
		p.Kill()
		return fmt.Errorf("process %s did not stop within 40s of SIGTERM", p.Name)
	}
}

// Kill kills the process with SIGKILL and waits for its end.
func (p *Proc) Kill() {
	p.ended.Store(true)
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Freeze stops the process with SIGSTOP: it keeps its connections, leases
// and sessions, and does nothing until Thaw.
func (p *Proc) Freeze() { _ = p.cmd.Process.Signal(syscall.SIGSTOP) }

// Thaw resumes a frozen process with SIGCONT.
func (p *Proc) Thaw() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Death describes how the process ended when nobody ended it: it was
// neither killed nor stopped (Kill, Stop) nor killed itself at the fault
// point it was armed with. It is "" while the process runs, and for an
// expected end.
func (p *Proc) Death() string {
	if !p.Exited() || p.ended.Load() {
		return ""
	}
	tail := p.Tail()
	if p.fault != "" && strings.Contains(tail, "fault point "+p.fault) {
		return ""
	}
	if len(tail) > 600 {
		tail = tail[len(tail)-600:]
	}
	return fmt.Sprintf("%s (pid %d) died on its own: %v; log %s ends with:\n%s", p.Name, p.Pid(), p.err, p.log, tail)
}

// Deaths returns the processes started by c that ended with nobody ending
// them (Proc.Death), in the order they were started.
func (c *Cluster) Deaths() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, p := range c.started {
		if d := p.Death(); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// StopAll stops every process still running.
func (c *Cluster) StopAll() {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() { _ = p.Stop() })
	}
	wg.Wait()
}
