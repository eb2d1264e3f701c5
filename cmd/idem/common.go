package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	idemmsg "github.com/idem-go/idem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem/internal/pprofhttp"
	"github.com/idem-go/idem/internal/registry"
)

// dbFlags are the flags of every command that opens a database.
type dbFlags struct {
	url    string
	schema string
}

func (f *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "db", "", "database URL (default $IDEM_DB_URL):\n"+registry.DatabaseURLHelp())
	fs.StringVar(&f.schema, "schema", "", "schema holding idem's tables (default $IDEM_SCHEMA, else the connection's search_path)")
}

func (f *dbFlags) open(ctx context.Context, e *env) (*registry.Database, error) {
	u := f.url
	if u == "" {
		u = e.getenv("IDEM_DB_URL")
	}
	schema := f.schema
	if schema == "" {
		schema = e.getenv("IDEM_SCHEMA")
	}
	return registry.OpenDatabase(ctx, u, registry.DatabaseOptions{Tables: idemmsg.Tables{Schema: schema}})
}

// newLogger returns a text or JSON slog logger on stderr at level.
func newLogger(e *env, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text", "":
		return slog.New(slog.NewTextHandler(e.stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(e.stderr, opts)), nil
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
// stops r and the ops server srv (which may be nil), giving both
// stopTimeout, and returns Stop's error as stopErr.
func runUntilStopped(ctx context.Context, r runner, srv *http.Server, stopTimeout time.Duration, started func()) (startErr, stopErr error) {
	if err := r.Start(ctx); err != nil {
		if srv != nil {
			_ = srv.Close()
		}
		return err, nil
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
	if srv != nil {
		_ = srv.Shutdown(stopCtx)
	}
	return nil, stopErr
}

// serveOps serves /metrics (cols, with the Go and process collectors),
// /healthz (healthy) and /debug/pprof/ on addr, in the background; it
// returns nil when addr is empty.
func serveOps(addr string, log *slog.Logger, healthy func() error, cols ...prometheus.Collector) (*http.Server, error) {
	if addr == "" {
		return nil, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(append(cols, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))...)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	pprofhttp.Register(mux)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server failed", "error", err)
		}
	}()
	log.Info("serving /metrics, /healthz and /debug/pprof/", "addr", ln.Addr().String())
	return srv, nil
}
