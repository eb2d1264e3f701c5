// Package startstop is the lifecycle every long-running service of idem
// embeds (the relay, the subscribers, the purger): named states, one meaning
// for Start's context, and a Stop that is idempotent, safe to call from
// several goroutines, and returns only when the service's work has ended.
//
// A service embeds a Base and drives it:
//
//	func (s *Service) Start(ctx context.Context) error {
//		if err := s.base.Starting(); err != nil {
//			return err
//		}
//		if err := s.connect(ctx); err != nil { // ctx bounds the start-up only
//			s.base.StartFailed()
//			return err
//		}
//		go func() { s.run(); s.base.Finished() }() // run returns after Stopping() is closed
//		s.base.Running()
//		return nil
//	}
//
//	func (s *Service) Stop(ctx context.Context) error {
//		return s.base.Stop(ctx, s.beginStop, s.abandon)
//	}
package startstop

import (
	"context"
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

// ErrStopped is returned by Starting for a service that was stopped.
var ErrStopped = idem.ErrStopped

// Base holds a service's lifecycle. The zero value is a new service.
type Base struct {
	once sync.Once

	mu        sync.Mutex
	state     State
	stopping  chan struct{} // closed by the first Stop (or a failed Start)
	done      chan struct{} // closed when the work has ended
	abandoned bool
}

func (b *Base) init() {
	b.once.Do(func() {
		b.stopping = make(chan struct{})
		b.done = make(chan struct{})
	})
}

// State returns the current state.
func (b *Base) State() State {
	b.init()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Starting moves a new service to Starting. It returns ErrStarted or
// ErrStopped when the service is not new.
func (b *Base) Starting() error {
	b.init()
	b.mu.Lock()
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

// Running records that Start succeeded: the service's work runs in the
// background and will call Finished when it has ended. It reports false
// when Stop was called during the start-up: the work must stop at once (it
// sees Stopping closed).
func (b *Base) Running() bool {
	b.mu.Lock()
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

// Finished records that the service's work has ended. Stop returns after
// it. It may be called more than once.
func (b *Base) Finished() {
	b.init()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == Stopped {
		return
	}
	b.state = Stopped
	select {
	case <-b.stopping:
	default:
		close(b.stopping)
	}
	close(b.done)
}

// Stopping is closed once Stop has been called (or the service stopped on
// its own): the work must finish what it holds and end.
func (b *Base) Stopping() <-chan struct{} {
	b.init()
	return b.stopping
}

// Done is closed once the service's work has ended.
func (b *Base) Done() <-chan struct{} {
	b.init()
	return b.done
}

// Stop stops the service and waits until its work has ended. The first call
// closes Stopping and, on a running service, calls graceful (when not nil),
// which tells the work to finish what it holds (during the start-up, Running
// reports false instead, and the service stops itself once started). When ctx ends before the work has, abandon (when not
// nil, called once) cancels what is in progress, and Stop waits for the end
// anyway and returns ctx's error. Stop on a new service stops it (it cannot
// start any more) and returns nil; on a stopped one, it returns nil at once.
// Every call returns only when the work has ended.
func (b *Base) Stop(ctx context.Context, graceful, abandon func()) error {
	b.init()
	b.mu.Lock()
	first := false
	switch b.state {
	case New:
		b.state = Stopped
		close(b.stopping)
		close(b.done)
		b.mu.Unlock()
		return nil
	case Starting:
		// Start is still running: Running reports false, and the service
		// stops its work itself once started.
		b.state = Stopping
		close(b.stopping)
	case Running:
		b.state = Stopping
		close(b.stopping)
		first = true
	}
	b.mu.Unlock()
	if first && graceful != nil {
		graceful()
	}
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	call := !b.abandoned && abandon != nil
	b.abandoned = true
	b.mu.Unlock()
	if call {
		abandon()
	}
	<-b.done
	return ctx.Err()
}
