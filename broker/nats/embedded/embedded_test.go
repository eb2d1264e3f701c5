package embedded_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/internal/testsvc"
)

// smallDisk mounts a tmpfs of size bytes for the test: a disk that fills up.
// It needs root (make test runs as root), and fails loudly without it.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts a small tmpfs to fill a disk, which needs root: run it as root (make test does)")
	}
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// When the disk fills up, a NATS server's file store keeps the write error
// and every later publish times out, even once space is back, until the
// process restarts. The embedded server restarts JetStream once space is
// back: publishes work again, and every message acknowledged before the
// failure is still there.
func TestJetStreamRecoversAfterDiskFull(t *testing.T) {
	disk := smallDisk(t, "64m")
	ctx := context.Background()
	srv, err := embedded.Start(ctx, embedded.Config{Dir: filepath.Join(disk, "nats"), SyncAlways: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	publish := func(n int) error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.Publish(pctx, "events.x", bytes.Repeat([]byte{'a'}, n))
		return err
	}
	acked := 0
	if err := publish(100); err != nil {
		t.Fatal(err)
	}
	acked++

	// Fill the disk but for a little room, then publish until a write
	// fails.
	filler := filepath.Join(disk, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 64<<10)); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	_ = f.Close()
	if err := os.Truncate(filler, mustSize(t, filler)-300<<10); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatal("100 publishes of 32 kB accepted by a full disk")
		}
		if err := publish(32 << 10); err != nil {
			break
		}
		acked++
	}
	if err := publish(100); err == nil {
		t.Fatal("a publish was accepted while the disk is full")
	}

	// Space is back: publishes are accepted again without a restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 20*time.Second, "a publish accepted again", func() bool { return publish(100) == nil })
	acked++
	st, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs < uint64(acked) {
		t.Fatalf("stream holds %d messages after recovery, want at least the %d acknowledged", info.State.Msgs, acked)
	}
	msg, err := st.GetMsg(ctx, 1)
	if err != nil || len(msg.Data) != 100 {
		t.Fatalf("first message after recovery: %v; want the 100 bytes published before the disk filled up", err)
	}
}

func mustSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestOneServerPerDir: a second server on a directory a server holds is
// refused at once, naming the holder; once the first has shut down, the
// directory can be used again.
func TestOneServerPerDir(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	first, err := embedded.Start(ctx, embedded.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := embedded.CheckDir(dir); !errors.Is(err, embedded.ErrDirInUse) {
		t.Errorf("CheckDir of a held directory = %v, want ErrDirInUse", err)
	}
	second, err := embedded.Start(ctx, embedded.Config{Dir: dir})
	if !errors.Is(err, embedded.ErrDirInUse) || !strings.Contains(err.Error(), fmt.Sprintf("process %d", os.Getpid())) {
		if second != nil {
			_ = second.Shutdown(ctx)
		}
		t.Fatalf("a second server on %s: %v, want ErrDirInUse naming pid %d", dir, err, os.Getpid())
	}
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := embedded.CheckDir(dir); err != nil {
		t.Errorf("CheckDir after Shutdown = %v", err)
	}
	again, err := embedded.Start(ctx, embedded.Config{Dir: dir})
	if err != nil {
		t.Fatalf("a server after the first shut down: %v", err)
	}
	if err := again.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}
