package periodic

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/startstop"
)

func TestRunsUntilStop(t *testing.T) {
	for _, immediate := range []bool{true, false} {
		var runs atomic.Int32
		third := make(chan struct{})
		l := &Loop{Interval: time.Millisecond, Jitter: 0.1, Immediate: immediate, Run: func(ctx context.Context) {
			if runs.Add(1) == 3 {
				close(third)
			}
		}}
		if err := l.Start(); err != nil {
			t.Fatal(err)
		}
		if err := l.Start(); !errors.Is(err, idem.ErrStarted) {
			t.Fatalf("second Start: %v, want idem.ErrStarted", err)
		}
		<-third
		if err := l.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		n := runs.Load()
		<-l.Done()
		if err := l.Start(); !errors.Is(err, idem.ErrStopped) {
			t.Fatalf("Start after Stop: %v, want idem.ErrStopped", err)
		}
		if runs.Load() != n {
			t.Fatal("Run called after Stop returned")
		}
	}
}

// Immediate runs at once; otherwise the first run waits one interval: a
// loop stopped before has run nothing.
func TestImmediate(t *testing.T) {
	for _, immediate := range []bool{true, false} {
		ran := make(chan struct{}, 1)
		l := &Loop{Interval: time.Hour, Immediate: immediate, Run: func(context.Context) { ran <- struct{}{} }}
		if err := l.Start(); err != nil {
			t.Fatal(err)
		}
		if immediate {
			<-ran
		}
		if err := l.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !immediate && len(ran) != 0 {
			t.Fatal("a loop without Immediate ran before its first interval")
		}
	}
}

// A run in progress finishes with its context live; when Stop's context
// ends first, the run's context is cancelled, Stop returns its error at once
// and Done is closed when the run has returned.
func TestStopCancelsARunOnlyAtItsDeadline(t *testing.T) {
	running := make(chan context.Context)
	release := make(chan struct{})
	l := &Loop{Interval: time.Hour, Immediate: true, Run: func(ctx context.Context) {
		running <- ctx
		<-release
	}}
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	ctx := <-running
	late, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Stop(late); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop out of time: %v, want context.Canceled", err)
	}
	if cause := context.Cause(ctx); !errors.Is(cause, startstop.ErrStopDeadline) {
		t.Fatalf("the run's context: cause %v, want ErrStopDeadline", cause)
	}
	select {
	case <-l.Done():
		t.Fatal("Done closed while Run runs")
	default:
	}
	close(release)
	<-l.Done()
	if err := l.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestStopBeforeStart(t *testing.T) {
	l := &Loop{Interval: time.Millisecond, Run: func(context.Context) { t.Error("Run called") }}
	if err := l.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	if err := l.Start(); !errors.Is(err, idem.ErrStopped) {
		t.Fatalf("Start after Stop: %v, want idem.ErrStopped", err)
	}
}
