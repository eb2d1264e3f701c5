package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem/internal/progress"
)

// progressIntervalEnv names the variable that sets how often the long
// commands (replay, failed retry --all/--group, purge, and idem cdc's first
// publishing of the rows that waited) log how far they are when their
// output is not a terminal.
const progressIntervalEnv = "IDEM_PROGRESS_INTERVAL"

// progressInterval returns the interval of the progress log lines:
// $IDEM_PROGRESS_INTERVAL, or 0 for the default (10s).
func progressInterval(e *env) (time.Duration, error) {
	s := e.getenv(progressIntervalEnv)
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive duration such as 10s or 1m", progressIntervalEnv, s)
	}
	return d, nil
}

// newProgress returns the progress report of a long command, counting
// unit against total (0: unknown): a line rewritten in place on stderr
// when it is a terminal, log lines on stderr otherwise.
func newProgress(e *env, name, unit string, total int64) (*progress.Reporter, error) {
	interval, err := progressInterval(e)
	if err != nil {
		return nil, err
	}
	cfg := progress.Config{Name: name, Unit: unit, Total: total, Interval: interval}
	if progress.IsTerminal(e.stderr) {
		cfg.Terminal = e.stderr
	} else {
		cfg.Logger = slog.New(slog.NewTextHandler(e.stderr, nil))
	}
	return progress.New(cfg), nil
}

// withProgress returns e with its outputs going through rep.Writer: on a
// terminal, a line printed clears the progress line first.
func withProgress(e *env, rep *progress.Reporter) *env {
	pe := *e
	pe.stdout, pe.stderr = rep.Writer(e.stdout), rep.Writer(e.stderr)
	return &pe
}
