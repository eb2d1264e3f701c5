// Package startstop is the lifecycle every long-running service of idem
// embeds (the relays, the subscribers, the purgers, the dashboard): named
// states, one meaning for Start's context, the contexts of the service's
// work, and a Stop that is idempotent, safe to call from several goroutines
// and at any moment (before Start, during it, twice).
//
// The Base owns two contexts, valid from its zero value and never nil:
//
//   - StopContext ends when Stop is called (or the service stopped on its
//     own): take no new work. Its cause is idem.ErrStopped.
//   - WorkContext ends when Stop runs out of time: cancel the work in
//     progress. Its cause is ErrStopDeadline. It also ends once the work has
//     ended (cause idem.ErrStopped), so that nothing derived from it leaks.
//
// StopContext ends whenever WorkContext does. A service drives its Base:
//
//	func (s *Service) Start(ctx context.Context) error {
//		if err := s.base.Starting(); err != nil {
//			return err
//		}
//		ctx, cancel := s.base.StartContext(ctx) // a Stop during the start-up ends it
//		defer cancel()
//		if err := s.connect(ctx); err != nil {
//			s.base.StartFailed()
//			return err
//		}
//		go func() { s.run(); s.base.Finished() }() // run ends once StopContext has
//		s.base.Running()
//		return nil
//	}
//
//	func (s *Service) Stop(ctx context.Context) error {
//		return s.base.Stop(ctx, nil, nil)
//	}
//
// Stop returns when the work has ended, or with ctx's error when ctx ends
// first: the work, its WorkContext cancelled, then ends in the background,
// and Done is closed when it has.
package startstop

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/idem-go/idem"
)

// State is the state of a service.
type State int

// States, in the order a service goes through them.
const (
	// New: not started yet.
	New State = iota
	// Starting: Start is running.
	Starting
	// Running: Start returned nil; the service works until Stop.
	Running
	// Stopping: Stop was called; the work in progress finishes.
	Stopping
	// Stopped: the service's work has ended (or Start failed, or Stop came
	// before Start). It cannot start again.
	Stopped
)

// String returns the state in lower case ("running", ...).
func (s State) String() string {
	switch s {
	case New:
		return "new"
	case Starting:
		return "starting"
	case Running:
		return "running"
	case Stopping:
		return "stopping"
	case Stopped:
		return "stopped"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// ErrStarted is returned by Starting for a service that was started before.
var ErrStarted = idem.ErrStarted

// ErrStopped is returned by Starting for a service that was stopped. It is
// also the cause of StopContext and WorkContext once Stop was called or the
// work has ended.
var ErrStopped = idem.ErrStopped

// ErrStopDeadline is the cause of WorkContext when Stop's context ended
// before the work: the work in progress is cancelled.
var ErrStopDeadline = errors.New("idem: stop deadline passed: the work in progress was cancelled")

// Base holds a service's lifecycle and the contexts of its work. The zero
// value is a new service. A Base must not be copied after first use.
type Base struct {
	mu        sync.Mutex
	inited    bool
	state     State
	done      chan struct{} // closed when the work has ended
	abandoned bool

	stopCtx    context.Context // ends at Stop
	stopCancel context.CancelCauseFunc
	workCtx    context.Context // ends when Stop runs out of time
	workCancel context.CancelCauseFunc
}

// initLocked creates the channel and the contexts, once. b.mu is held.
func (b *Base) initLocked() {
	if b.inited {
		return
	}
	b.inited = true
	b.done = make(chan struct{})
	b.workCtx, b.workCancel = context.WithCancelCause(context.Background())
	b.stopCtx, b.stopCancel = context.WithCancelCause(b.workCtx)
}

func (b *Base) lock() {
	b.mu.Lock()
	b.initLocked()
}

// State returns the current state.
func (b *Base) State() State {
	b.lock()
	defer b.mu.Unlock()
	return b.state
}

// Starting moves a new service to Starting. It returns ErrStarted or
// ErrStopped when the service is not new.
func (b *Base) Starting() error {
	b.lock()
	defer b.mu.Unlock()
	switch b.state {
	case New:
		b.state = Starting
		return nil
	case Stopping, Stopped:
		return ErrStopped
	}
	return ErrStarted
}

// StartContext returns a context for the start-up: it ends when ctx does or
// when Stop is called, so that a Stop during the start-up interrupts it (the
// start-up then fails with the cause, ErrStopped). Call cancel when the
// start-up is over.
func (b *Base) StartContext(ctx context.Context) (context.Context, context.CancelFunc) {
	stop := b.StopContext()
	ctx, cancel := context.WithCancelCause(ctx)
	unhook := context.AfterFunc(stop, func() { cancel(context.Cause(stop)) })
	return ctx, func() {
		unhook()
		cancel(context.Canceled)
	}
}

// StopContext returns the context that ends when Stop is called (or the
// service stopped on its own, or never started): the work must take nothing
// new, finish what it holds and end. Its cause is ErrStopped (or
// ErrStopDeadline, when Stop ran out of time). It is the same context for
// the Base's life.
func (b *Base) StopContext() context.Context {
	b.lock()
	defer b.mu.Unlock()
	return b.stopCtx
}

// Stopping is StopContext().Done().
func (b *Base) Stopping() <-chan struct{} { return b.StopContext().Done() }

// WorkContext returns the context of the work in progress: it ends when
// Stop runs out of time (cause ErrStopDeadline), or once the work has ended
// (cause ErrStopped). It is the same context for the Base's life.
func (b *Base) WorkContext() context.Context {
	b.lock()
	defer b.mu.Unlock()
	return b.workCtx
}

// Running records that Start succeeded: the service's work runs in the
// background and will call Finished when it has ended. It reports false
// when Stop was called during the start-up: the work must stop at once (it
// sees StopContext done).
func (b *Base) Running() bool {
	b.lock()
	defer b.mu.Unlock()
	if b.state == Starting {
		b.state = Running
		return true
	}
	return false
}

// StartFailed records that Start failed: nothing runs; the service is
// stopped.
func (b *Base) StartFailed() { b.Finished() }

// Finished records that the service's work has ended: Done is closed and
// both contexts end. It may be called more than once.
func (b *Base) Finished() {
	b.lock()
	defer b.mu.Unlock()
	b.finishLocked()
}

func (b *Base) finishLocked() {
	if b.state == Stopped {
		return
	}
	b.state = Stopped
	b.stopCancel(ErrStopped)
	b.workCancel(ErrStopped)
	close(b.done)
}

// Done is closed once the service's work has ended.
func (b *Base) Done() <-chan struct{} {
	b.lock()
	defer b.mu.Unlock()
	return b.done
}

// Stop stops the service. The first call ends StopContext and, on a running
// service, calls graceful (when not nil), which tells the work to finish what
// it holds; during the start-up, Running reports false instead, and the
// service stops its work once started. Stop returns nil once the work has
// ended. When ctx ends first, Stop cancels WorkContext with ErrStopDeadline,
// calls abandon (when not nil; once for all the calls of Stop), and returns
// ctx's error at once: the work ends in the background, and Done is closed
// when it has. Stop on a new service stops it (it cannot start any more) and
// returns nil; on a stopped one, it returns nil at once.
func (b *Base) Stop(ctx context.Context, graceful, abandon func()) error {
	b.lock()
	first := false
	switch b.state {
	case New:
		b.finishLocked()
		b.mu.Unlock()
		return nil
	case Stopped:
		b.mu.Unlock()
		return nil
	case Starting:
		b.state = Stopping
	case Running:
		b.state = Stopping
		first = true
	}
	b.stopCancel(ErrStopped)
	done := b.done
	b.mu.Unlock()
	if first && graceful != nil {
		graceful()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	if b.state == Stopped { // the work ended as ctx did
		b.mu.Unlock()
		return nil
	}
	call := !b.abandoned && abandon != nil
	b.abandoned = true
	b.workCancel(ErrStopDeadline)
	b.mu.Unlock()
	if call {
		abandon()
	}
	return ctx.Err()
}
