package progress_test

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/progress"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a fake clock that moves only when told.
type clock struct{ t time.Time }

func (c *clock) now() time.Time           { return c.t }
func (c *clock) add(d time.Duration)      { c.t = c.t.Add(d) }
func newClock() *clock                    { return &clock{t: time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)} }
func screen(b *bytes.Buffer) []string     { return strings.Split(b.String(), "\r\033[K")[1:] }
func last(b *bytes.Buffer) string         { s := screen(b); return s[len(s)-1] }
func count(b *bytes.Buffer, s string) int { return strings.Count(b.String(), s) }

// TestTerminal: the line is drawn at the first Add, rewritten in place (\r
// and erase) at most every Redraw, shows done / total, percent, rate and
// time left; the summary replaces it and ends with a newline.
func TestTerminal(t *testing.T) {
	c := newClock()
	var out bytes.Buffer
	r := progress.New(progress.Config{Name: "replay", Unit: "events", Total: 600_000, Terminal: &out, Now: c.now})
	c.add(time.Second)
	r.Add(1000)
	if got, want := last(&out), "replay: 1,000 / 600,000 events  0.2%  1,000/s  9m59s left"; got != want {
		t.Fatalf("first line %q, want %q", got, want)
	}
	// Within Redraw of the last draw: counted, not drawn.
	c.add(100 * time.Millisecond)
	r.Add(1000)
	if n := len(screen(&out)); n != 1 {
		t.Fatalf("%d draws within 200ms, want 1: %q", n, out.String())
	}
	c.add(100 * time.Millisecond)
	r.Add(1000)
	if got, want := last(&out), "replay: 3,000 / 600,000 events  0.5%  2,500/s  3m59s left"; got != want {
		t.Fatalf("line after 200ms %q, want %q", got, want)
	}
	if strings.Contains(out.String(), "\n") {
		t.Fatalf("a progress line ended with a newline: %q", out.String())
	}
	c.add(2 * time.Hour)
	r.Set(600_000)
	r.Finish(progress.Count{Name: "not sent", N: 2}, progress.Count{Name: "skipped", N: 0})
	if got, want := last(&out), "replay: 600,000 of 600,000 events in 2h00m (83/s), 2 not sent\n"; got != want {
		t.Fatalf("summary %q, want %q", got, want)
	}
	// Finished: nothing more is drawn.
	r.Add(1)
	r.Finish()
	if got := last(&out); !strings.HasSuffix(got, "2 not sent\n") {
		t.Fatalf("drawn after Finish: %q", out.String())
	}
}

// TestTerminalUnknownTotal: without a total, the count, the rate and the
// elapsed time.
func TestTerminalUnknownTotal(t *testing.T) {
	c := newClock()
	var out bytes.Buffer
	r := progress.New(progress.Config{Name: "purge", Unit: "rows", Terminal: &out, Now: c.now})
	c.add(90 * time.Second)
	r.Add(4500)
	if got, want := last(&out), "purge: 4,500 rows  50/s  1m30s"; got != want {
		t.Fatalf("line %q, want %q", got, want)
	}
	r.Finish()
	if got, want := last(&out), "purge: 4,500 rows in 1m30s (50/s)\n"; got != want {
		t.Fatalf("summary %q, want %q", got, want)
	}
}

// TestTerminalWriter: a line printed through Writer clears the progress
// line first, and the next Add draws it again at once, below.
func TestTerminalWriter(t *testing.T) {
	c := newClock()
	var out bytes.Buffer
	r := progress.New(progress.Config{Name: "failed retry", Unit: "messages", Total: 3, Terminal: &out, Now: c.now})
	w := r.Writer(&out)
	c.add(time.Second)
	r.Add(1)
	_, _ = w.Write([]byte("Retried 1\n"))
	r.Add(1) // within Redraw, but the line was cleared
	want := "\r\033[Kfailed retry: 1 / 3 messages  33.3%  1.0/s  2s left" +
		"\r\033[KRetried 1\n" +
		"\r\033[Kfailed retry: 2 / 3 messages  66.7%  2.0/s  500ms left"
	if out.String() != want {
		t.Fatalf("screen %q, want %q", out.String(), want)
	}
	var plain bytes.Buffer
	if w := progress.New(progress.Config{Logger: slog.New(slog.DiscardHandler)}).Writer(&plain); w != &plain {
		t.Error("Writer without a terminal is not the writer itself")
	}
}

// TestLog: without a terminal, a log line every Interval (not at each
// Add), with the figures as attributes, and a summary with the caller's
// counts.
func TestLog(t *testing.T) {
	c := newClock()
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	r := progress.New(progress.Config{Name: "replay", Unit: "events", Total: 1000, Logger: log, Interval: 10 * time.Second, Now: c.now})
	for range 9 {
		c.add(time.Second)
		r.Add(10)
	}
	if out.Len() != 0 {
		t.Fatalf("logged before the interval: %q", out.String())
	}
	c.add(time.Second)
	r.Add(10)
	want := `level=INFO msg="replay progress" events=100 total=1000 percent=10 per_second=10 elapsed=10s left=1m30s` + "\n"
	if out.String() != want {
		t.Fatalf("log %q, want %q", out.String(), want)
	}
	c.add(5 * time.Second)
	r.Add(50)
	if count(&out, "progress") != 1 {
		t.Fatalf("logged again within the interval: %q", out.String())
	}
	out.Reset()
	r.Finish(progress.Count{Name: "not sent", N: 1}, progress.Count{Name: "skipped", N: 0})
	want = `level=INFO msg="replay done" events=150 total=1000 percent=15 per_second=10 elapsed=15s not_sent=1 skipped=0` + "\n"
	if out.String() != want {
		t.Fatalf("summary %q, want %q", out.String(), want)
	}
}

// TestIsTerminal: a file or a buffer is not a terminal; a character
// device is.
func TestIsTerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if progress.IsTerminal(f) || progress.IsTerminal(&bytes.Buffer{}) {
		t.Error("a file or a buffer taken for a terminal")
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if !progress.IsTerminal(null) {
		t.Error("a character device not taken for a terminal")
	}
}

func TestFormats(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 600_000_000: "600,000,000", -1234: "-1,234"} {
		if got := progress.Group(n); got != want {
			t.Errorf("Group(%d) = %q, want %q", n, got, want)
		}
	}
	for d, want := range map[time.Duration]string{850 * time.Millisecond: "850ms", 12 * time.Second: "12s",
		185 * time.Second: "3m05s", 13*time.Hour + 30*time.Minute: "13h30m", 200 * time.Hour: "200h00m"} {
		if got := progress.Duration(d); got != want {
			t.Errorf("Duration(%v) = %q, want %q", d, got, want)
		}
	}
	for r, want := range map[float64]string{2.5: "2.5/s", 12345.4: "12,345/s"} {
		if got := progress.Rate(r); got != want {
			t.Errorf("Rate(%v) = %q, want %q", r, got, want)
		}
	}
}
