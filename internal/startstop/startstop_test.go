package startstop

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// service is a minimal service on Base: its work ends once told to stop,
// or when its context is cancelled.
type service struct {
	base     Base
	graceful atomic.Int32
	abandons atomic.Int32
	slow     chan struct{} // the work ends only when this is closed (or abandoned)
	cancel   chan struct{}
}

func (s *service) start() error {
	if err := s.base.Starting(); err != nil {
		return err
	}
	s.cancel = make(chan struct{})
	go func() {
		<-s.base.Stopping()
		if s.slow != nil {
			select {
			case <-s.slow:
			case <-s.cancel:
			}
		}
		s.base.Finished()
	}()
	s.base.Running()
	return nil
}

func (s *service) stop(ctx context.Context) error {
	return s.base.Stop(ctx, func() { s.graceful.Add(1) }, func() { s.abandons.Add(1); close(s.cancel) })
}

func TestStates(t *testing.T) {
	s := &service{}
	if st := s.base.State(); st != New {
		t.Fatalf("state %v, want new", st)
	}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	if err := s.start(); !errors.Is(err, ErrStarted) {
		t.Fatalf("second start: %v, want ErrStarted", err)
	}
	if err := s.stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := s.base.State(); st != Stopped {
		t.Fatalf("state %v, want stopped", st)
	}
	if err := s.start(); !errors.Is(err, ErrStopped) {
		t.Fatalf("start after stop: %v, want ErrStopped", err)
	}
	if n := s.graceful.Load(); n != 1 {
		t.Fatalf("graceful called %d times, want 1", n)
	}
}

func TestStopBeforeStart(t *testing.T) {
	s := &service{}
	if err := s.stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.start(); !errors.Is(err, ErrStopped) {
		t.Fatalf("start after stop: %v, want ErrStopped", err)
	}
}

// Concurrent Stops all return only after the work has ended; the first
// deadline abandons the work once.
func TestConcurrentStopsWaitForTheEnd(t *testing.T) {
	s := &service{slow: make(chan struct{})}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var returned atomic.Int32
	for range 4 {
		wg.Go(func() {
			_ = s.stop(context.Background())
			returned.Add(1)
		})
	}
	time.Sleep(50 * time.Millisecond)
	if n := returned.Load(); n != 0 {
		t.Fatalf("%d Stop calls returned while the work runs", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := s.stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stop with a deadline: %v, want DeadlineExceeded", err)
	}
	wg.Wait()
	if n := s.abandons.Load(); n != 1 {
		t.Fatalf("abandon called %d times, want 1", n)
	}
	if n := s.graceful.Load(); n != 1 {
		t.Fatalf("graceful called %d times, want 1", n)
	}
}

// A Stop during the start-up: Running reports false and the service stops
// itself; Stop returns once it has.
func TestStopDuringStart(t *testing.T) {
	var b Base
	if err := b.Starting(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error)
	go func() {
		stopped <- b.Stop(context.Background(), func() { t.Error("graceful called during the start-up") }, nil)
	}()
	<-b.Stopping()
	if b.Running() {
		t.Fatal("Running reported true after a Stop during the start-up")
	}
	select {
	case <-stopped:
		t.Fatal("Stop returned before the work ended")
	case <-time.After(20 * time.Millisecond):
	}
	b.Finished()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

func TestStartFailed(t *testing.T) {
	var b Base
	if err := b.Starting(); err != nil {
		t.Fatal(err)
	}
	b.StartFailed()
	if err := b.Stop(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if st := b.State(); st != Stopped {
		t.Fatalf("state %v, want stopped", st)
	}
}
