package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem/internal/adminhttp"
	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/redact"
	"github.com/idem-go/idem/internal/registry"
)

// dbFlags are the flags of every command that opens a database: --db (or
// --db-file) and --schema.
type dbFlags struct{ registry.DatabaseFlags }

func (f *dbFlags) register(fs *flag.FlagSet) {
	f.Register(fs)
	envflag.FileFlag(fs, "db")
}

func (f *dbFlags) open(ctx context.Context, e *env) (*registry.Database, error) {
	return f.Open(ctx, e.getenv)
}

// newLogger returns a text or JSON slog logger on stderr at level, which
// redacts secrets (redact.Handler) from whatever is logged through it.
func newLogger(e *env, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text", "":
		return slog.New(redact.Handler(slog.NewTextHandler(e.stderr, opts))), nil
	case "json":
		return slog.New(redact.Handler(slog.NewJSONHandler(e.stderr, opts))), nil
	}
	return nil, usagef("--log-format %q: want text or json", format)
}

// confirm asks a yes/no question on stdin; anything but y/yes is no.
func confirm(e *env, question string) bool {
	fmt.Fprintf(e.stderr, "%s [y/N] ", question)
	var answer string
	if _, err := fmt.Fscanln(e.stdin, &answer); err != nil {
		return false
	}
	answer = strings.ToLower(strings.TrimSpace(answer))
	return answer == "y" || answer == "yes"
}

// parseTime accepts RFC 3339 times, dates, and durations back from now ("2h").
func parseTime(flagName, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	return time.Time{}, usagef("--%s %q: want an RFC 3339 time (2026-12-02T08:00:00Z), a date (2026-12-02) or a duration back from now (90m)", flagName, s)
}

// runner is what idem relay and idem cdc run: a relay.
type runner interface {
	Start(context.Context) error
	Stop(context.Context) error
	Done() <-chan struct{}
}

// runUntilStopped starts r (returning Start's error as startErr), calls
// started, and waits for ctx (SIGINT, SIGTERM) or for r to end; then it
// stops r and the ops address (which may be nil), giving both stopTimeout,
// and returns Stop's error as stopErr.
func runUntilStopped(ctx context.Context, r runner, ops *opsServer, stopTimeout time.Duration, started func()) (startErr, stopErr error) {
	if err := r.Start(ctx); err != nil {
		return err, nil // the caller closes ops
	}
	started()
	select {
	case <-ctx.Done():
	case <-r.Done():
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	stopErr = r.Stop(stopCtx)
	if stopErr != nil {
		<-r.Done() // the work, cancelled, ends: rows are released before the exit
	}
	ops.shutdown(stopCtx)
	return nil, stopErr
}

// opsFlags are the flags of the ops address of idem relay and idem cdc.
type opsFlags struct {
	addr  string
	admin adminhttp.Flags
}

// opsTokenEnv holds the token of the ops address when no file is given.
const opsTokenEnv = "IDEM_METRICS_TOKEN"

func (f *opsFlags) register(fs *flag.FlagSet, addr string) {
	fs.StringVar(&f.addr, "metrics-addr", addr, "address of /metrics and /healthz (and /debug/pprof/ with --pprof); empty: none.\nBeyond loopback it needs --auth-token-file (or $"+opsTokenEnv+") or --insecure-no-auth")
	f.admin.Register(fs, "--metrics-addr", opsTokenEnv, true)
}

// opsServer is the ops address of idem relay and idem cdc: /metrics,
// /healthz and, with --pprof, /debug/pprof/. A nil *opsServer (no
// --metrics-addr) serves nothing.
type opsServer struct {
	srv *adminhttp.Server
	log *slog.Logger
}

// listen checks the address against the policy (adminhttp.Check) and
// listens on it, before the command opens anything else; nil when
// --metrics-addr is empty.
func (f *opsFlags) listen(e *env, log *slog.Logger) (*opsServer, error) {
	if f.addr == "" {
		return nil, nil
	}
	cfg, err := f.admin.Config(f.addr, e.getenv, log)
	if err != nil {
		return nil, &usageError{err.Error()}
	}
	srv, err := adminhttp.Listen(cfg)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	return &opsServer{srv: srv, log: log}, nil
}

// serve serves /metrics (cols, with the Go and process collectors) and
// /healthz (healthy), in the background, from before the relay starts (a
// standby waiting for its slot answers).
func (s *opsServer) serve(healthy func() error, cols ...prometheus.Collector) {
	if s == nil {
		return
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(append(cols, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))...)
	s.srv.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s.srv.HandleHealth(healthy)
	s.srv.Start()
	paths := "/metrics, /healthz"
	if s.srv.Pprof() {
		paths += ", /debug/pprof/"
	}
	s.log.Info("serving "+paths, "addr", s.srv.Addr().String(), "token", s.srv.Authenticated())
}

func (s *opsServer) shutdown(ctx context.Context) {
	if s != nil {
		_ = s.srv.Shutdown(ctx)
	}
}

// close closes the address at once: deferred by the commands, for the
// returns before runUntilStopped shuts it down.
func (s *opsServer) close() {
	if s != nil {
		_ = s.srv.Close()
	}
}
