// Package testsvc starts the long-running services of idem (subscribers,
// relays) in tests and stops them when the test ends.
package testsvc

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Service is what subscribers and relays have in common.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Start starts svc or fails the test, and returns a function that stops it
// gracefully, once; the test's cleanup calls it too. Each call has 30s.
func Start(t testing.TB, svc Service) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := svc.Stop(ctx); err != nil {
				t.Errorf("Stop: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// WaitFor polls cond every 5ms until it is true, and fails the test if it is
// still false after d; what says what was awaited.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Ctx returns a context that ends after d or with the test.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
