package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// TestOneShopPerDataDir: a second shop on the data directory of a running
// one (the embedded defaults: SQLite files and the embedded broker's
// store) is refused before it opens anything, naming the first's pid and
// --data-dir; once the first is SIGKILLed, the kernel has released its
// lock and a new shop starts there.
func TestOneShopPerDataDir(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	cl := &shopkit.Cluster{Binary: shopBinary, DataDir: dir, LogDir: t.TempDir()}
	t.Cleanup(cl.StopAll)
	first, err := cl.Start(ctx, shopkit.ProcSpec{Name: "first", Services: "all"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := cl.Start(ctx, shopkit.ProcSpec{Name: "second", Services: "all"})
	if !errors.Is(err, shopkit.ErrExitedAtStart) {
		t.Fatalf("a second shop on %s: %v, want it to exit at once", dir, err)
	}
	msg := second.Tail()
	for _, want := range []string{fmt.Sprintf("in use by process %d", first.Pid()), "--data-dir", dir} {
		if !strings.Contains(msg, want) {
			t.Errorf("the second shop's error does not say %q:\n%s", want, msg)
		}
	}
	// Refused before it opened anything: no migration, no listener.
	if strings.Contains(second.Stdout(), "shop: ready") || strings.Contains(msg, "level=") {
		t.Errorf("the second shop went on before it was refused:\n%s\n%s", second.Stdout(), msg)
	}
	// The first goes on.
	if _, err := shopkit.PlaceOK(ctx, first.HTTP, "c-1", 1); err != nil {
		t.Fatalf("the first shop after the second was refused: %v", err)
	}

	first.Kill()
	third, err := cl.Start(ctx, shopkit.ProcSpec{Name: "third", Services: "all"})
	if err != nil {
		t.Fatalf("a shop after the first was SIGKILLed: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "nats", embedded.LockFile))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(third.Pid()) {
		t.Errorf("lock file holds %q (%v), want the pid of the shop holding the directory, %d", b, err, third.Pid())
	}
}
