// Package pausewatch reads the operators' pause of one consumer or relay
// (idem.Pause, the consumer_pause table) at most once per interval, for the
// consumers of package inbox and the relays, which check it before each
// delivery or claim: a pause takes effect within the interval on every
// replica, and a pause that ends by itself (Until) ends on time.
package pausewatch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/errlog"
)

// Interval is how often the relays read their pause: a pause takes effect
// within it on every replica.
const Interval = time.Second

// readTimeout bounds one read of the pause.
const readTimeout = 5 * time.Second

// Watch is the pause of one consumer or relay, as last read.
type Watch struct {
	kind  idem.PauseKind
	name  string
	d     driver.Pauses
	ex    driver.Executor
	every time.Duration
	now   func() time.Time
	log   *slog.Logger
	errs  *errlog.Limiter

	mu     sync.Mutex
	readAt time.Time // zero: never read
	pause  idem.Pause
	found  bool
	active bool // as last reported, for the log lines of a change
}

// New returns the watch of the pause of kind and name in d's table, read on
// ex at most once per every, by the clock now. log receives a line when the
// pause begins and ends, and the failures to read it.
func New(kind idem.PauseKind, name string, d driver.Pauses, ex driver.Executor, every time.Duration, now func() time.Time, log *slog.Logger) *Watch {
	return &Watch{kind: kind, name: name, d: d, ex: ex, every: every, now: now, log: log,
		errs: errlog.New(log, "read the "+string(kind)+"'s pause", errlog.Config{})}
}

// Check returns the pause in force now, if any, and how long the caller
// may take it as it is before checking again: at most the interval, and no
// later than the pause's end. A nil Watch pauses nothing. It reads the table when its last read is an
// interval old. A failed read keeps the last answer (none, at first): a
// database that is away pauses the consumer or relay anyway, through its
// own errors, and a table not yet migrated pauses nothing.
func (w *Watch) Check(ctx context.Context) (idem.Pause, time.Duration, bool) {
	if w == nil {
		return idem.Pause{}, Interval, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	if w.readAt.IsZero() || now.Sub(w.readAt) >= w.every || now.Before(w.readAt) {
		w.read(ctx, now)
	}
	active := w.found && w.pause.ActiveAt(now)
	if active != w.active {
		w.active = active
		if active {
			what, resume := "consumer paused by an operator: it takes no message", "idem resume "+w.name
			if w.kind == idem.PauseRelay {
				what, resume = "relay paused by an operator: it publishes nothing", "idem resume --relay "+w.name
			}
			attrs := []any{"reason", w.pause.Reason, "by", w.pause.By, "paused_at", w.pause.At}
			if until := "until resumed (" + resume + ")"; w.pause.Until.IsZero() {
				w.log.Warn(what+" "+until, attrs...)
			} else {
				w.log.Warn(what+" until its pause ends, or it is resumed ("+resume+")", append(attrs, "until", w.pause.Until)...)
			}
		} else {
			w.log.Info(string(w.kind) + " resumed: its pause was removed or has ended")
		}
	}
	next := w.every - now.Sub(w.readAt)
	if w.found && !w.pause.Until.IsZero() && w.pause.Until.After(now) {
		next = min(next, w.pause.Until.Sub(now))
	}
	if w.found && !active && !w.pause.From.IsZero() && w.pause.From.After(now) {
		next = min(next, w.pause.From.Sub(now))
	}
	next = max(next, time.Millisecond)
	if !active {
		return idem.Pause{}, next, false
	}
	return w.pause, next, true
}

// read reads the pause; w.mu is held.
func (w *Watch) read(ctx context.Context, now time.Time) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readTimeout)
	defer cancel()
	ps, err := w.d.ListPauses(rctx, w.ex, w.kind, w.name)
	w.readAt = now
	if err != nil {
		w.errs.Warn(ctx, "cannot read the "+string(w.kind)+"'s pause; going on as last read", err, "name", w.name)
		return
	}
	w.errs.OK(ctx)
	w.found = len(ps) > 0
	if w.found {
		w.pause = ps[0]
	}
}

// Last returns the pause Check last found in force, without reading the
// table: for figures (Stats) that must not touch the database. A nil Watch
// has none.
func (w *Watch) Last() (idem.Pause, bool) {
	if w == nil {
		return idem.Pause{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.active {
		return idem.Pause{}, false
	}
	return w.pause, true
}

// Set records p as the pause of kind and name, after checking it
// (idem.Pause.Validate): the one write behind inbox.PauseStore and
// relay.PauseStore.
func Set(ctx context.Context, d driver.Pauses, ex driver.Executor, kind idem.PauseKind, name string, p idem.Pause) error {
	if err := p.Validate(); err != nil {
		return err
	}
	p.Kind, p.Name = kind, name
	if err := d.SetPause(ctx, ex, p); err != nil {
		return fmt.Errorf("idem: pause the %s %s: %w", kind, name, err)
	}
	return nil
}

// Delete removes the pause of kind and name, and reports whether there
// was one.
func Delete(ctx context.Context, d driver.Pauses, ex driver.Executor, kind idem.PauseKind, name string) (bool, error) {
	ok, err := d.DeletePause(ctx, ex, kind, name)
	if err != nil {
		return false, fmt.Errorf("idem: resume the %s %s: %w", kind, name, err)
	}
	return ok, nil
}

// List returns the pauses of every name of kind, ended ones included,
// sorted by name.
func List(ctx context.Context, d driver.Pauses, ex driver.Executor, kind idem.PauseKind) ([]idem.Pause, error) {
	ps, err := d.ListPauses(ctx, ex, kind, "")
	if err != nil {
		return nil, fmt.Errorf("idem: list the pauses of %ss: %w", kind, err)
	}
	return ps, nil
}
