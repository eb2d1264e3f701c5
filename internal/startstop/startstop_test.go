package startstop

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// op is one call on a Base, and what it must return.
type op struct {
	call string // starting, running, finished, startFailed, stop, stopLate (Stop with a context already ended)
	err  error  // for starting, stop and stopLate
	ok   bool   // for running
}

// after is the Base's observable state after a step.
type after struct {
	state     State
	stopCause error // nil: StopContext live
	workCause error // nil: WorkContext live
	done      bool
	graceful  int
	abandons  int
}

func TestStateMachine(t *testing.T) {
	tests := []struct {
		name  string
		steps []op
		want  after
	}{
		{"new", nil, after{state: New}},
		{"stop before start",
			[]op{{call: "stop"}, {call: "starting", err: ErrStopped}, {call: "stop"}, {call: "stopLate"}},
			after{state: Stopped, stopCause: ErrStopped, workCause: ErrStopped, done: true}},
		{"started twice",
			[]op{{call: "starting"}, {call: "running", ok: true}, {call: "starting", err: ErrStarted}},
			after{state: Running}},
		{"started twice during the start-up",
			[]op{{call: "starting"}, {call: "starting", err: ErrStarted}},
			after{state: Starting}},
		{"start failed",
			[]op{{call: "starting"}, {call: "startFailed"}, {call: "starting", err: ErrStopped}, {call: "stop"}},
			after{state: Stopped, stopCause: ErrStopped, workCause: ErrStopped, done: true}},
		{"ended on its own",
			[]op{{call: "starting"}, {call: "running", ok: true}, {call: "finished"}, {call: "stop"}, {call: "starting", err: ErrStopped}},
			after{state: Stopped, stopCause: ErrStopped, workCause: ErrStopped, done: true}},
		{"stop out of time while running",
			[]op{{call: "starting"}, {call: "running", ok: true}, {call: "stopLate", err: context.Canceled}},
			after{state: Stopping, stopCause: ErrStopped, workCause: ErrStopDeadline, graceful: 1, abandons: 1}},
		{"the work ends after a stop out of time",
			[]op{{call: "starting"}, {call: "running", ok: true}, {call: "stopLate", err: context.Canceled}, {call: "finished"}, {call: "stop"}},
			after{state: Stopped, stopCause: ErrStopped, workCause: ErrStopDeadline, done: true, graceful: 1, abandons: 1}},
		{"stops out of time abandon once",
			[]op{{call: "starting"}, {call: "running", ok: true}, {call: "stopLate", err: context.Canceled}, {call: "stopLate", err: context.Canceled}},
			after{state: Stopping, stopCause: ErrStopped, workCause: ErrStopDeadline, graceful: 1, abandons: 1}},
		{"stop during the start-up",
			[]op{{call: "starting"}, {call: "stopLate", err: context.Canceled}, {call: "running", ok: false}, {call: "starting", err: ErrStopped}},
			after{state: Stopping, stopCause: ErrStopped, workCause: ErrStopDeadline, abandons: 1}},
		{"start failed after a stop during the start-up",
			[]op{{call: "starting"}, {call: "stopLate", err: context.Canceled}, {call: "startFailed"}},
			after{state: Stopped, stopCause: ErrStopped, workCause: ErrStopDeadline, done: true, abandons: 1}},
		{"finished twice",
			[]op{{call: "starting"}, {call: "running", ok: true}, {call: "finished"}, {call: "finished"}, {call: "startFailed"}},
			after{state: Stopped, stopCause: ErrStopped, workCause: ErrStopped, done: true}},
	}
	late, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Base
			var got after
			graceful := func() { got.graceful++ }
			abandon := func() { got.abandons++ }
			for i, s := range tt.steps {
				var err error
				switch s.call {
				case "starting":
					err = b.Starting()
				case "running":
					if ok := b.Running(); ok != s.ok {
						t.Fatalf("step %d: Running() = %v, want %v", i, ok, s.ok)
					}
				case "finished":
					b.Finished()
				case "startFailed":
					b.StartFailed()
				case "stop":
					err = b.Stop(context.Background(), graceful, abandon)
				case "stopLate":
					err = b.Stop(late, graceful, abandon)
				default:
					t.Fatalf("unknown call %q", s.call)
				}
				if !errors.Is(err, s.err) || (err == nil) != (s.err == nil) {
					t.Fatalf("step %d: %s: %v, want %v", i, s.call, err, s.err)
				}
			}
			got.state = b.State()
			got.stopCause = context.Cause(b.StopContext())
			got.workCause = context.Cause(b.WorkContext())
			select {
			case <-b.Done():
				got.done = true
			default:
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			if (b.StopContext().Err() == nil) != (tt.want.stopCause == nil) {
				t.Fatalf("StopContext().Err() = %v with cause %v", b.StopContext().Err(), tt.want.stopCause)
			}
			if b.Stopping() != b.StopContext().Done() {
				t.Fatal("Stopping() is not StopContext().Done()")
			}
		})
	}
}

// A zero Base has its contexts: nothing a service reads from it is nil.
func TestZeroValueContexts(t *testing.T) {
	var b Base
	if b.StopContext() == nil || b.WorkContext() == nil || b.Done() == nil || b.Stopping() == nil {
		t.Fatal("a zero Base returned nil")
	}
	if b.StopContext() != b.StopContext() || b.WorkContext() != b.WorkContext() {
		t.Fatal("the contexts changed between two calls")
	}
}

// Stop waits for the work; several Stops from several goroutines all return
// once it has ended, and graceful runs once.
func TestStopWaitsForTheWork(t *testing.T) {
	var b Base
	if err := b.Starting(); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	go func() {
		<-b.Stopping()
		<-release
		b.Finished()
	}()
	b.Running()
	var graceful sync.WaitGroup
	graceful.Add(1)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- b.Stop(context.Background(), graceful.Done, func() { t.Error("abandon called") }) })
	}
	graceful.Wait() // the first Stop has begun; the work is held by release
	select {
	case <-b.Done():
		t.Fatal("Done closed while the work runs")
	default:
	}
	if b.State() != Stopping {
		t.Fatalf("state %v, want stopping", b.State())
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if b.State() != Stopped {
		t.Fatalf("state %v, want stopped", b.State())
	}
}

// A Stop whose context ends returns at once with ctx's error, its work
// cancelled through WorkContext; a Stop without deadline waits on, and
// returns once the work has ended; Done is closed then.
func TestStopAtItsDeadlineReturnsWhileTheWorkEnds(t *testing.T) {
	var b Base
	if err := b.Starting(); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	work := b.WorkContext()
	go func() {
		<-work.Done() // in-flight work, cancelled only when Stop runs out of time
		<-release     // then some cleaning up
		b.Finished()
	}()
	b.Running()
	patient := make(chan error, 1)
	go func() { patient <- b.Stop(context.Background(), nil, nil) }()

	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := b.Stop(ctx, nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop with a deadline: %v, want DeadlineExceeded", err)
	}
	if cause := context.Cause(work); !errors.Is(cause, ErrStopDeadline) {
		t.Fatalf("WorkContext's cause %v, want ErrStopDeadline", cause)
	}
	select {
	case <-b.Done():
		t.Fatal("Done closed before the work ended")
	case err := <-patient:
		t.Fatalf("Stop without deadline returned %v before the work ended", err)
	default:
	}
	close(release)
	<-b.Done()
	if err := <-patient; err != nil {
		t.Fatalf("Stop without deadline: %v", err)
	}
}

// StartContext ends at Stop, so that a start-up in progress is interrupted.
func TestStartContextEndsAtStop(t *testing.T) {
	var b Base
	if err := b.Starting(); err != nil {
		t.Fatal(err)
	}
	started := make(chan error)
	go func() {
		ctx, cancel := b.StartContext(context.Background())
		defer cancel()
		<-ctx.Done() // a connection that never answers
		err := context.Cause(ctx)
		b.StartFailed()
		started <- err
	}()
	if err := b.Stop(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-started; !errors.Is(err, ErrStopped) {
		t.Fatalf("start-up ended with %v, want ErrStopped", err)
	}

	// The caller's context still bounds it, and cancel releases it.
	var b2 Base
	parent, cancelParent := context.WithCancel(context.Background())
	ctx, cancel := b2.StartContext(parent)
	cancelParent()
	<-ctx.Done()
	cancel()
	if err := ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("StartContext after its parent ended: %v", err)
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{New: "new", Starting: "starting", Running: "running", Stopping: "stopping", Stopped: "stopped", 9: "State(9)"} {
		if got := s.String(); got != want {
			t.Errorf("%d: %q, want %q", int(s), got, want)
		}
	}
}
