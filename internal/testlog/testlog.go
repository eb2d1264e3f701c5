// Package testlog gives the services a test starts (consumers, relays,
// subscribers) a *slog.Logger that writes to the test's own output, as
// t.Log does: shown with the test that failed, or under go test -v, and
// never mixed with other tests' lines. Long values are cut, and bytes that
// are not text are quoted, so that one record stays one readable line.
// Records that arrive once the test has ended are dropped.
package testlog

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
)

// MaxValueLen is the length beyond which a logged value is cut.
const MaxValueLen = 200

// New returns a logger writing records at info level and above to t's
// output.
func New(t testing.TB) *slog.Logger { return NewLevel(t, slog.LevelInfo) }

// NewLevel returns a logger writing records at level and above to t's
// output.
func NewLevel(t testing.TB, level slog.Leveler) *slog.Logger {
	w := &writer{out: t.Output()}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: replace}))
}

// writer writes to a test's output until the test ends.
type writer struct {
	mu     sync.Mutex
	out    io.Writer
	closed bool
}

func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return len(p), nil
	}
	return w.out.Write(p)
}

func (w *writer) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}

// replace writes times as a clock and cuts long values.
func replace(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindTime:
		if a.Key == slog.TimeKey {
			return slog.String(a.Key, a.Value.Time().Format("15:04:05.000"))
		}
		return a
	case slog.KindString:
		return slog.String(a.Key, cut(a.Value.String()))
	case slog.KindAny:
		switch v := a.Value.Any().(type) {
		case []byte:
			return slog.String(a.Key, cut(string(v)))
		case error:
			return slog.String(a.Key, cut(v.Error()))
		}
		return slog.String(a.Key, cut(fmt.Sprintf("%+v", a.Value.Any())))
	}
	return a
}

func cut(s string) string {
	if len(s) <= MaxValueLen {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:MaxValueLen], len(s))
}
