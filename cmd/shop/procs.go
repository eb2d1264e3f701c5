package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idem-go/idem"
)

// cluster starts shop processes sharing one namespace on the same servers.
type cluster struct {
	appAddr   string
	binary    string
	db        string
	broker    string
	namespace string
	dataDir   string
	logDir    string
	extraEnv  []string
	// relay and outbox, when set, are every process's --relay and
	// --outbox.
	relay, outbox string

	mu    sync.Mutex
	procs []*proc
}

// proc is one running shop process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	http   string
	exited chan struct{}
	err    error
	log    string
	stdout *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// procSpec says how to start a process.
type procSpec struct {
	name       string
	services   string
	fault      string
	http       string // reuse an address (restart); empty picks a free one
	carrierURL string
}

// errExitedAtStart is returned (wrapped) for a process that exited before
// it was ready.
var errExitedAtStart = errors.New("exited before it was ready")

// start starts a process and waits until it prints "shop: ready".
func (c *cluster) start(ctx context.Context, spec procSpec) (*proc, error) {
	addr := spec.http
	if addr == "" {
		var err error
		if addr, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	// Empty settings are left to the command's defaults: with no --db and
	// no --broker, the embedded ones under --data-dir.
	args := []string{"--services", spec.services, "--http", addr, "--summary", "0",
		"--relay-lease", "2s", "--key-lock-timeout", "1s", "--log-level", "warn"}
	for _, f := range [][2]string{{"--db", c.db}, {"--broker", c.broker}, {"--namespace", c.namespace}, {"--data-dir", c.dataDir}, {"--relay", c.relay}, {"--outbox", c.outbox}} {
		if f[1] != "" {
			args = append(args, f[0], f[1])
		}
	}
	if spec.carrierURL != "" {
		args = append(args, "--carrier-url", spec.carrierURL)
	}
	return c.run(ctx, spec.name, addr, spec.fault, args)
}

// run starts the shop binary with args, and waits until it prints "shop:
// ready". addr is the process's HTTP address, if any.
func (c *cluster) run(ctx context.Context, name, addr, fault string, args []string) (*proc, error) {
	cmd := exec.Command(c.binary, args...)
	cmd.Env = append(os.Environ(), c.extraEnv...)
	cmd.Env = append(cmd.Env, "IDEM_FAULT="+fault)
	logPath := fmt.Sprintf("%s/%s-%d.log", c.logDir, name, time.Now().UnixNano())
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logFile
	out := &lockedBuffer{}
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, http: addr, exited: make(chan struct{}), log: logPath, stdout: out}
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
	c.mu.Unlock()
	t := time.NewTimer(60 * time.Second)
	defer t.Stop()
	select {
	case <-ready:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("process %s %w: %v\n%s", name, errExitedAtStart, p.err, p.tail())
	case <-t.C:
		p.kill()
		return nil, fmt.Errorf("process %s not ready after 60s\n%s", name, p.tail())
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	}
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	s := string(b)
	if len(s) > 3000 {
		s = s[len(s)-3000:]
	}
	return s
}

// logText returns the process's whole log so far.
func (p *proc) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// problems returns the last warnings and errors of the process's log, for
// failures that happened long before its tail.
func (p *proc) problems() string { return problemLines(p.logText()) }

// problemLines returns the last 40 warnings and errors of log.
func problemLines(log string) string {
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

// waitKilled waits until the process died at its fault point.
func (p *proc) waitKilled(d time.Duration) error {
	select {
	case <-p.exited:
		if !strings.Contains(p.tail(), "fault point") {
			return fmt.Errorf("process %s exited without hitting its fault point: %v\n%s", p.name, p.err, p.tail())
		}
		return nil
	case <-time.After(d):
		return fmt.Errorf("process %s did not hit its fault point within %v", p.name, d)
	}
}

// stop sends SIGTERM and waits for a graceful exit.
func (p *proc) stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(40 * time.Second):
		p.kill()
		return fmt.Errorf("process %s did not stop within 40s of SIGTERM", p.name)
	}
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// stopAll stops every process still running.
func (c *cluster) stopAll() {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() { _ = p.stop() })
	}
	wg.Wait()
}

// placeResult is the answer to POST /orders.
type placeResult struct {
	Status   int
	ID       string
	Replayed bool
	Body     string
}

var httpClient = &http.Client{Timeout: 30 * time.Second}

// placeOrder posts an order with lines products, with key when not empty.
func placeOrder(ctx context.Context, addr, key, customer string, lines int) (placeResult, error) {
	return placeOrderWith(ctx, httpClient, addr, key, customer, lines)
}

// placeOrderWith is placeOrder through client: shop load sizes its own
// connection pool for its concurrency.
func placeOrderWith(ctx context.Context, client *http.Client, addr, key, customer string, lines int) (placeResult, error) {
	type line struct {
		ProductID string `json:"product_id"`
		Quantity  string `json:"quantity"`
	}
	body := struct {
		CustomerID string `json:"customer_id"`
		Lines      []line `json:"lines"`
	}{CustomerID: customer}
	for i := range lines {
		body.Lines = append(body.Lines, line{ProductID: fmt.Sprintf("p-%d", i+1), Quantity: fmt.Sprintf("%d.000", i+1)})
	}
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/orders", bytes.NewReader(raw))
	if err != nil {
		return placeResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return placeResult{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	res := placeResult{Status: resp.StatusCode, Body: string(b), Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	var o struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(b, &o) == nil {
		res.ID = o.ID
	}
	return res, nil
}

// placeOK places an order and fails unless it is created.
func placeOK(ctx context.Context, addr, customer string, lines int) (string, error) {
	r, err := placeOrder(ctx, addr, "", customer, lines)
	if err != nil {
		return "", err
	}
	if r.Status != http.StatusCreated {
		return "", fmt.Errorf("POST /orders: %d %s", r.Status, r.Body)
	}
	return r.ID, nil
}

// getJSON gets url into v.
func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// postJSON posts v to url.
func postJSON(ctx context.Context, url string, v any) error {
	raw, _ := json.Marshal(v)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s", url, resp.Status)
	}
	return nil
}

type idemMessage = idem.Message
