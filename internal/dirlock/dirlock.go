// Package dirlock gives a directory to one process at a time: an exclusive
// flock(2) on a lock file in it, held while the process uses the directory
// and released by the kernel when the process ends, however it ends (a
// kill -9 leaves no stale lock). The file holds the holder's pid, so that
// a process refused can say which process holds the directory.
//
// The embedded NATS server (broker/nats/embedded) takes it on its store
// directory: two servers on one JetStream store corrupt it.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ErrHeld is wrapped by the error of Lock when another holder has the
// directory.
var ErrHeld = errors.New("directory in use")

// HeldError is the error of Lock when the directory is held: by the
// process PID (0 when the holder has not written it yet), through the lock
// file Path. It wraps ErrHeld.
type HeldError struct {
	Path string
	PID  int
}

func (e *HeldError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("%s is locked by another process (%s)", filepath.Dir(e.Path), e.Path)
	}
	return fmt.Sprintf("%s is in use by process %d (it holds %s)", filepath.Dir(e.Path), e.PID, e.Path)
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

// Lock is a held lock on a directory.
type Lock struct {
	f *os.File
}

// Acquire locks the directory dir through its lock file name, creating
// both when missing, and writes the process's pid in the file. It fails at
// once with a *HeldError when another open lock holds it, from another
// process or from this one (locks are per open file, not per process).
func Acquire(dir, name string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := flock(f); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &HeldError{Path: path, PID: readPID(path)}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Check reports, as Acquire would, whether dir is held through its lock
// file name, without keeping the lock: a check before anything else is
// opened, so that a second process stops at once. It creates nothing.
func Check(dir, name string) error {
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := flock(f); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return &HeldError{Path: path, PID: readPID(path)}
		}
		return fmt.Errorf("lock %s: %w", path, err)
	}
	return nil // closing f releases it
}

// Release releases the lock. The file stays: its next holder rewrites it.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// flock takes an exclusive lock on f without waiting.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// readPID returns the pid written in the lock file at path, 0 when none.
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
