package errlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a clock that the test moves.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// line is one logged record.
type line struct {
	level  slog.Level
	msg    string
	attrs  map[string]any
	source string
}

// recorder is a slog.Handler that keeps the records.
type recorder struct {
	mu    sync.Mutex
	lines []line
}

func (h *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *recorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recorder) WithGroup(string) slog.Handler            { return h }

func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	l := line{level: r.Level, msg: r.Message, attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		l.attrs[a.Key] = a.Value.Any()
		return true
	})
	if f := r.Source(); f != nil {
		l.source = filepath.Base(f.File)
	}
	h.mu.Lock()
	h.lines = append(h.lines, l)
	h.mu.Unlock()
	return nil
}

func (h *recorder) take() []line {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.lines
	h.lines = nil
	return out
}

func setup(cfg Config) (*Limiter, *clock, *recorder) {
	h := &recorder{}
	c := &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	l := New(slog.New(h), "claims", cfg)
	l.now = c.now
	return l, c, h
}

var ctx = context.Background()

func refused(port int) error {
	return fmt.Errorf("dial tcp 127.0.0.1:%d: connect: connection refused", port)
}

func wantLines(t *testing.T, got []line, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%d lines, want %d: %+v", len(got), n, got)
	}
}

func TestFirstLineThenSummary(t *testing.T) {
	l, c, h := setup(Config{})
	l.Error(ctx, "claim failed", refused(5432), "worker", 3)
	got := h.take()
	wantLines(t, got, 1)
	if got[0].level != slog.LevelError || got[0].msg != "claim failed" || got[0].attrs["worker"] != int64(3) ||
		got[0].attrs["error"].(error).Error() != refused(5432).Error() {
		t.Fatalf("first line %+v", got[0])
	}
	if _, ok := got[0].attrs["repeated"]; ok {
		t.Fatalf("first line says repeated: %+v", got[0])
	}

	// Repeats within the interval are counted, whatever the digits.
	for i := range 99 {
		c.add(IntervalDefault / 100)
		l.Error(ctx, "claim failed", refused(6000+i), "worker", i)
	}
	wantLines(t, h.take(), 0)

	// The first repeat after the interval logs the count, with the latest
	// error and attributes.
	c.add(IntervalDefault / 100)
	l.Error(ctx, "claim failed", refused(7777), "worker", 7)
	got = h.take()
	wantLines(t, got, 1)
	s := got[0]
	if s.level != slog.LevelError || s.msg != "claim failed" || s.attrs["repeated"] != int64(100) ||
		s.attrs["over"] != IntervalDefault || s.attrs["worker"] != int64(7) || !strings.Contains(s.attrs["error"].(error).Error(), "7777") {
		t.Fatalf("summary %+v", s)
	}

	// The next summary counts from there.
	for range 5 {
		l.Error(ctx, "claim failed", refused(1))
	}
	c.add(IntervalDefault)
	l.Error(ctx, "claim failed", refused(1))
	got = h.take()
	wantLines(t, got, 1)
	if got[0].attrs["repeated"] != int64(6) {
		t.Fatalf("second summary %+v", got[0])
	}
}

func TestSecondCause(t *testing.T) {
	l, c, h := setup(Config{Interval: time.Minute})
	l.Warn(ctx, "claim failed", refused(5432))
	l.Warn(ctx, "claim failed", errors.New("pq: too many connections for role \"relay\""))
	l.Warn(ctx, "mark failed", refused(5432)) // another message: another cause
	l.Warn(ctx, "claim failed", nil)          // no error: the message alone
	l.Warn(ctx, "claim failed", refused(15432))
	l.Warn(ctx, "claim failed", nil)
	got := h.take()
	wantLines(t, got, 4)
	for i, want := range []string{"claim failed", "claim failed", "mark failed", "claim failed"} {
		if got[i].msg != want || got[i].level != slog.LevelWarn {
			t.Errorf("line %d: %+v, want %q at WARN", i, got[i], want)
		}
	}
	if _, ok := got[3].attrs["error"]; ok {
		t.Errorf("a failure without error has an error attribute: %+v", got[3])
	}
	// Each cause has its own interval and count.
	c.add(time.Minute)
	l.Warn(ctx, "claim failed", refused(1))
	l.Warn(ctx, "mark failed", refused(1))
	got = h.take()
	wantLines(t, got, 2)
	if got[0].attrs["repeated"] != int64(2) || got[1].attrs["repeated"] != int64(1) {
		t.Fatalf("summaries %+v", got)
	}
}

func TestRecovered(t *testing.T) {
	l, c, h := setup(Config{})
	for range 250 {
		l.Error(ctx, "claim failed", refused(5432))
		c.add(100 * time.Millisecond)
	}
	l.Error(ctx, "claim failed", errors.New("timeout"))
	wantLines(t, h.take(), 4) // a first line, two summaries, the second cause
	c.add(time.Second)
	l.OK(ctx)
	l.OK(ctx)
	got := h.take()
	wantLines(t, got, 1)
	r := got[0]
	if r.level != slog.LevelInfo || r.msg != "claims recovered" || r.attrs["failures"] != int64(251) ||
		r.attrs["failed_for"] != 26*time.Second {
		t.Fatalf("recovered line %+v", r)
	}

	// An interval after its last line, a cause is new again.
	c.add(IntervalDefault)
	l.Error(ctx, "claim failed", refused(5432))
	got = h.take()
	wantLines(t, got, 1)
	if _, ok := got[0].attrs["repeated"]; ok {
		t.Fatalf("first line of a new outage says repeated: %+v", got[0])
	}
	l.OK(ctx)
	got = h.take()
	wantLines(t, got, 1)
	if got[0].attrs["failures"] != int64(1) || got[0].attrs["failed_for"] != time.Duration(0) {
		t.Fatalf("recovered line %+v", got[0])
	}
}

func TestOKWithoutFailures(t *testing.T) {
	l, _, h := setup(Config{})
	l.OK(ctx)
	wantLines(t, h.take(), 0)
	if n := testing.AllocsPerRun(1000, func() { l.OK(ctx) }); n != 0 {
		t.Fatalf("OK allocates %v times while nothing fails", n)
	}
}

// TestIntermittent: an operation that fails now and then, with successes
// in between, logs a cause at most once per interval, and a recovered line
// only after a logged line.
func TestIntermittent(t *testing.T) {
	l, c, h := setup(Config{})
	total := 0
	for i := range 1000 {
		if i%10 == 0 {
			l.Error(ctx, "request failed", errors.New("bad row 42"))
			total++
		} else {
			l.OK(ctx)
		}
		c.add(100 * time.Millisecond)
	}
	got := h.take()
	// 100 s: a first line, then a summary and a recovered line per
	// interval.
	if len(got) > 2+2*10 {
		t.Fatalf("%d lines for %d failures in 100s", len(got), total)
	}
	failures := int64(0)
	for _, ln := range got {
		if ln.msg == "claims recovered" {
			failures += ln.attrs["failures"].(int64)
		}
	}
	// Every failure is in a recovered line's count but those after the
	// last logged line.
	c.add(IntervalDefault)
	l.Error(ctx, "request failed", errors.New("bad row 43"))
	l.OK(ctx)
	for _, ln := range h.take() {
		if ln.msg == "claims recovered" {
			failures += ln.attrs["failures"].(int64)
		}
	}
	if failures != int64(total+1) {
		t.Fatalf("recovered lines count %d failures, want %d", failures, total+1)
	}
}

func TestMaxCauses(t *testing.T) {
	l, c, h := setup(Config{MaxCauses: 2})
	for i := range 10 {
		l.Warn(ctx, fmt.Sprintf("failure %c", 'a'+i), nil)
	}
	// Two causes, then the first of the others.
	got := h.take()
	wantLines(t, got, 3)
	if got[2].msg != "failure c" {
		t.Fatalf("first line of the other causes %+v", got[2])
	}
	if len(l.causes) != 2 {
		t.Fatalf("%d causes remembered, want 2", len(l.causes))
	}
	// While the two causes have repeats to report, others are counted
	// together.
	l.Warn(ctx, "failure a", nil)
	l.Warn(ctx, "failure b", nil)
	c.add(IntervalDefault)
	l.Warn(ctx, "failure z", nil)
	got = h.take()
	wantLines(t, got, 1)
	if got[0].msg != "failure z" || got[0].attrs["other_causes_repeated"] != int64(8) {
		t.Fatalf("summary of the other causes %+v", got[0])
	}
	// Causes with nothing to report make room an interval after their last
	// line.
	l.Warn(ctx, "failure a", nil)
	l.Warn(ctx, "failure b", nil)
	wantLines(t, h.take(), 2) // their summaries
	c.add(IntervalDefault)
	l.Warn(ctx, "failure y", nil)
	got = h.take()
	wantLines(t, got, 1)
	if _, ok := got[0].attrs["other_causes_repeated"]; ok || len(l.causes) != 1 {
		t.Fatalf("a new cause once the others are stale: %+v, %d causes", got[0], len(l.causes))
	}
}

func TestConcurrent(t *testing.T) {
	l, c, h := setup(Config{})
	const goroutines, each = 8, 2000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				if (g+i)%3 == 0 {
					l.OK(ctx)
					continue
				}
				l.Error(ctx, "request failed", refused(g*each+i))
			}
		})
	}
	wg.Wait()
	failures := int64(goroutines * each)
	for g := range goroutines {
		for i := range each {
			if (g+i)%3 == 0 {
				failures--
			}
		}
	}
	// The clock stands still: one first line, at most one recovered line.
	got := h.take()
	if len(got) == 0 || len(got) > 2 || got[0].msg != "request failed" {
		t.Fatalf("lines %+v", got)
	}
	counted := int64(0)
	if len(got) == 2 {
		counted = got[1].attrs["failures"].(int64)
	}
	c.add(IntervalDefault)
	l.Error(ctx, "request failed", refused(1))
	l.OK(ctx)
	got = h.take()
	wantLines(t, got, 2)
	if counted+got[1].attrs["failures"].(int64) != failures+1 {
		t.Fatalf("recovered lines count %d+%v failures, want %d", counted, got[1].attrs["failures"], failures+1)
	}
}

func TestSourceIsTheCaller(t *testing.T) {
	l, _, h := setup(Config{})
	l.Error(ctx, "failed", nil)
	l.Warn(ctx, "failed too", nil)
	l.Log(ctx, slog.LevelDebug, "failed again", nil)
	l.OK(ctx)
	_, file, _, _ := runtime.Caller(0)
	for _, ln := range h.take() {
		if ln.source != filepath.Base(file) {
			t.Errorf("%q attributed to %q, want %q", ln.msg, ln.source, filepath.Base(file))
		}
	}
}

func TestCauseKey(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		err  error
		want string
	}{
		{"m", nil, "m"},
		{"m", refused(5432), "m\x00dial tcp #.#.#.#:#: connect: connection refused"},
		{"m", errors.New("x1y22z"), "m\x00x#y#z"},
		{"m", errors.New(strings.Repeat("a", 1000)), "m\x00" + strings.Repeat("a", maxKeyText)},
	} {
		if got := causeKey(tc.msg, tc.err); got != tc.want {
			t.Errorf("causeKey(%q, %v) = %q, want %q", tc.msg, tc.err, got, tc.want)
		}
	}
}

func TestDefaults(t *testing.T) {
	got := Config{Interval: -time.Second}.WithDefaults()
	if got.Interval != IntervalDefault || got.MaxCauses != MaxCausesDefault {
		t.Fatalf("defaults %+v", got)
	}
	l := New(nil, "", Config{})
	if l.log != slog.Default() || l.what != "operation" {
		t.Fatalf("New(nil, \"\") = %+v", l)
	}
}
