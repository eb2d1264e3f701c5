package dirlock_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/dirlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAcquire: a held directory refuses a second lock, even in the same
// process, naming the holder's pid; Check says the same without locking;
// once released, the directory can be locked again.
func TestAcquire(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := dirlock.Check(dir, "LOCK"); err != nil {
		t.Fatalf("Check of a directory never locked = %v", err)
	}
	l, err := dirlock.Acquire(dir, "LOCK")
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"Acquire": func() error { _, err := dirlock.Acquire(dir, "LOCK"); return err }(), "Check": dirlock.Check(dir, "LOCK")} {
		var held *dirlock.HeldError
		if !errors.As(err, &held) || !errors.Is(err, dirlock.ErrHeld) || held.PID != os.Getpid() {
			t.Fatalf("%s of a held directory = %v, want a HeldError naming pid %d", name, err, os.Getpid())
		}
		if !strings.Contains(err.Error(), "in use by process") || !strings.Contains(err.Error(), dir) {
			t.Errorf("%s: %q does not say which directory and process", name, err)
		}
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := dirlock.Check(dir, "LOCK"); err != nil {
		t.Fatalf("Check after Release = %v", err)
	}
	l, err = dirlock.Acquire(dir, "LOCK")
	if err != nil {
		t.Fatalf("Acquire after Release = %v", err)
	}
	_ = l.Release()
}
