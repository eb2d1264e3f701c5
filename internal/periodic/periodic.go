// Package periodic runs a function at a jittered interval as a long-running
// service (the purgers' loop), on the lifecycle of package startstop.
package periodic

import (
	"context"
	"time"

	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/startstop"
)

// Loop calls Run every Interval, changed by a random fraction in
// [-Jitter, +Jitter] each time, from Start until Stop. Set its fields
// before Start; a Loop must not be copied after.
type Loop struct {
	// Interval is the wait between two runs (from the end of one to the
	// start of the next). Required.
	Interval time.Duration
	// Jitter is the fraction of Interval a wait may differ by (0.1: ±10%).
	Jitter float64
	// Immediate runs Run at once at Start, before the first wait.
	Immediate bool
	// Run is called with a context that ends when Stop runs out of time.
	// Required.
	Run func(ctx context.Context)

	base startstop.Base
}

// Start starts the loop in the background. It returns startstop.ErrStarted
// or startstop.ErrStopped (idem.ErrStarted, idem.ErrStopped) when the loop
// was started or stopped before.
func (l *Loop) Start() error {
	if err := l.base.Starting(); err != nil {
		return err
	}
	stop, work := l.base.StopContext(), l.base.WorkContext()
	go func() {
		defer l.base.Finished()
		if l.Immediate {
			l.Run(work)
		}
		for ctxsleep.Sleep(stop, backoff.Jitter(l.Interval, l.Jitter)) {
			l.Run(work)
		}
	}()
	l.base.Running()
	return nil
}

// Stop ends the loop: a run in progress finishes, unless ctx ends first,
// which cancels it and returns ctx's error at once (Done is closed once the
// run has returned). It returns nil once the loop has ended. It is
// idempotent, safe to call from several goroutines, and on a loop never
// started it prevents a later start.
func (l *Loop) Stop(ctx context.Context) error { return l.base.Stop(ctx, nil, nil) }

// Done is closed once the loop has ended (or was stopped before it
// started).
func (l *Loop) Done() <-chan struct{} { return l.base.Done() }
