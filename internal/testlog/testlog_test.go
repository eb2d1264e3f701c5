package testlog_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testlog"
)

// fakeT is a test whose output and cleanups are kept.
type fakeT struct {
	testing.TB
	out      bytes.Buffer
	cleanups []func()
}

func (f *fakeT) Output() io.Writer { return &f.out }
func (f *fakeT) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeT) end() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func TestLogger(t *testing.T) {
	ft := &fakeT{TB: t}
	log := testlog.New(ft)
	log.Debug("not shown")
	log.Warn("parked", "body", []byte("\x00\xff"+strings.Repeat("x", 500)), "error", errors.New("bad"))
	got := ft.out.String()
	if strings.Contains(got, "not shown") {
		t.Errorf("a debug record was written: %s", got)
	}
	if !strings.Contains(got, `body="\x00\xff`) || !strings.Contains(got, "...(502 bytes)") || !strings.Contains(got, "error=bad") {
		t.Errorf("record %q: want the body quoted and cut, and the error", got)
	}
	if n := strings.Count(got, "\n"); n != 1 {
		t.Errorf("%d lines, want 1", n)
	}
	ft.end()
	log.Error("after the end", "k", "v")
	if strings.Contains(ft.out.String(), "after the end") {
		t.Error("a record was written after the test ended")
	}
	testlog.NewLevel(ft, slog.LevelDebug).Debug("shown")
}
