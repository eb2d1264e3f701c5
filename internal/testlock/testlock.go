// Package testlock shares a test server between the test processes of one
// run: tests that use the server hold a shared lock on it while they run,
// and a test that stops or restarts it takes the lock exclusively, so that
// it never breaks another test's connections. The lock is a file lock in
// IDEM_TEST_DIR, so it holds across the packages go test runs in parallel.
package testlock

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// Lock is the lock of one server. The zero value is not usable; use New.
type Lock struct {
	name string

	mu        sync.Mutex
	cond      *sync.Cond
	file      *os.File
	shared    int
	exclusive bool
}

// New returns the lock of the server called name ("postgres", "rabbitmq").
func New(name string) *Lock {
	l := &Lock{name: name}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *Lock) open() error {
	if l.file != nil {
		return nil
	}
	dir := os.Getenv("IDEM_TEST_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := os.OpenFile(filepath.Join(dir, l.name+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	l.file = f
	return nil
}

func (l *Lock) flock(how int) error {
	if err := l.open(); err != nil {
		return err
	}
	for {
		err := syscall.Flock(int(l.file.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}

// acquire takes a shared hold; l.mu is held.
func (l *Lock) acquire() error {
	if l.exclusive {
		// The test holding the server exclusively (or one of its subtests).
		return nil
	}
	if l.shared == 0 {
		if err := l.flock(syscall.LOCK_SH); err != nil {
			return err
		}
	}
	l.shared++
	return nil
}

// release gives a shared hold back; l.mu is held.
func (l *Lock) release() {
	if l.shared == 0 {
		return
	}
	l.shared--
	if l.shared == 0 {
		_ = l.flock(syscall.LOCK_UN)
		l.cond.Broadcast()
	}
}

// Shared holds the server, shared, until t ends: no other test stops it
// meanwhile.
func (l *Lock) Shared(t testing.TB) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	wasExclusive := l.exclusive
	if err := l.acquire(); err != nil {
		t.Fatalf("lock the test %s server: %v", l.name, err)
	}
	if wasExclusive {
		return
	}
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.release()
	})
}

// SharedForProcess holds the server, shared, until the returned function is
// called: for TestMain and runnable examples, which have no *testing.T.
func (l *Lock) SharedForProcess() (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.acquire(); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.release()
		})
	}, nil
}

// Exclusive holds the server alone until t ends, so that t may stop and
// start it. It waits for the other tests of this process to release it,
// then for those of other processes. Call it before anything of t takes a
// shared hold, in a test that does not run in parallel with others of its
// package that use the server.
func (l *Lock) Exclusive(t testing.TB) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.shared > 0 {
		l.cond.Wait()
	}
	if err := l.flock(syscall.LOCK_EX); err != nil {
		t.Fatalf("lock the test %s server exclusively: %v", l.name, err)
	}
	l.exclusive = true
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.exclusive = false
		_ = l.flock(syscall.LOCK_UN)
		l.cond.Broadcast()
	})
}

// HeldExclusively reports whether a test of this process holds the server
// exclusively.
func (l *Lock) HeldExclusively() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.exclusive
}
