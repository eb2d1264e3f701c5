// Package progress tells how far a long piece of work is: a replay, a
// re-drive of parked messages, a purge, the rows a log relay publishes
// before its stream. A Reporter counts what is done (Add, Set) against a
// total when one is known, and shows it one of two ways:
//
//   - on a terminal, one line rewritten in place with \r (done / total,
//     percent, rate, time left), redrawn a few times a second at most;
//   - otherwise (a file, a pipe, a log collector, a daemon), a log line
//     every Interval (10s by default).
//
// Finish ends it with a summary: done, elapsed time, rate, and the counts
// the caller adds (errors, skipped). The work's own loops never print:
// they call a hook (relay.ReplayOptions.Progress, inbox.PurgeConfig.Progress,
// the report function of inbox.FailureStore.RetryGroup), and the command
// or the relay feeds the Reporter from it.
package progress

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of Config.
const (
	// IntervalDefault is how often a line is logged.
	IntervalDefault = 10 * time.Second
	// RedrawDefault is the least time between two draws of a terminal
	// line: five a second at most.
	RedrawDefault = 200 * time.Millisecond
)

// Config configures a Reporter.
type Config struct {
	// Name says what runs, at the start of each line: "replay",
	// "failed retry".
	Name string
	// Unit names what is counted, in the plural: "events", "messages".
	Unit string
	// Total is how many there are to do, 0 when unknown (the lines then
	// give the count and the rate only).
	Total int64
	// Terminal, when not nil, receives the line rewritten in place: set
	// it to a terminal only (IsTerminal). When nil, Logger gets lines.
	Terminal io.Writer
	// Logger receives a line every Interval, and the summary, when
	// Terminal is nil. Defaults to slog.Default().
	Logger *slog.Logger
	// Running and Finished are the messages of the log lines while it
	// runs and of the summary. Default to Name+" progress" and Name+"
	// done".
	Running, Finished string
	// Interval is how often a line is logged. Defaults to 10s.
	Interval time.Duration
	// Redraw is the least time between two draws of the terminal line.
	// Defaults to 200ms.
	Redraw time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Count is a figure the summary adds after the rate: {"not retried", 3}
// reads "3 not retried" on a terminal (left out when 0) and not_retried=3
// in a log line.
type Count struct {
	Name string
	N    int64
}

// Reporter tells how far a piece of work is. Its methods are safe to call
// from several goroutines.
type Reporter struct {
	cfg Config

	mu       sync.Mutex
	start    time.Time
	last     time.Time // of the last line drawn or logged
	done     int64
	total    int64
	shown    bool // the terminal line is on the screen
	finished bool
}

// New returns a Reporter whose clock starts now.
func New(cfg Config) *Reporter {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Interval <= 0 {
		cfg.Interval = IntervalDefault
	}
	if cfg.Redraw <= 0 {
		cfg.Redraw = RedrawDefault
	}
	if cfg.Terminal == nil && cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Running == "" {
		cfg.Running = cfg.Name + " progress"
	}
	if cfg.Finished == "" {
		cfg.Finished = cfg.Name + " done"
	}
	now := cfg.Now()
	return &Reporter{cfg: cfg, start: now, last: now, total: max(cfg.Total, 0)}
}

// IsTerminal reports whether w is a terminal (a character device), where a
// line can be rewritten in place.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Add counts n more done, and draws or logs a line when it is time.
func (r *Reporter) Add(n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done += n
	r.tick()
}

// Set sets the count done (for hooks that report a running total), and
// draws or logs a line when it is time.
func (r *Reporter) Set(done int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = done
	r.tick()
}

// SetTotal sets the total, once it is known (0: unknown).
func (r *Reporter) SetTotal(total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total = max(total, 0)
}

// Done returns the count done so far.
func (r *Reporter) Done() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// tick draws the terminal line (at most every Redraw, at once after
// something else was written over it) or logs a line (every Interval).
func (r *Reporter) tick() {
	if r.finished {
		return
	}
	now := r.cfg.Now()
	if r.cfg.Terminal != nil {
		if r.shown && now.Sub(r.last) < r.cfg.Redraw {
			return
		}
		r.last, r.shown = now, true
		fmt.Fprint(r.cfg.Terminal, "\r\033[K"+r.line(now))
		return
	}
	if now.Sub(r.last) < r.cfg.Interval {
		return
	}
	r.last = now
	r.cfg.Logger.Info(r.cfg.Running, r.attrs(now, false)...)
}

// Finish ends the report with its summary: on a terminal, the line
// replaced by the summary and a newline; otherwise a log line. counts are
// added to it. Calls after the first do nothing: a command defers one
// and calls it with its counts when it ends well.
func (r *Reporter) Finish(counts ...Count) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return
	}
	r.finished = true
	now := r.cfg.Now()
	if r.cfg.Terminal != nil {
		fmt.Fprint(r.cfg.Terminal, "\r\033[K"+r.summary(now, counts)+"\n")
		r.shown = false
		return
	}
	attrs := r.attrs(now, true)
	for _, c := range counts {
		attrs = append(attrs, strings.ReplaceAll(c.Name, " ", "_"), c.N)
	}
	r.cfg.Logger.Info(r.cfg.Finished, attrs...)
}

// Writer returns a writer for the lines a command prints while the report
// runs (one per message retried, say): on a terminal, each write first
// clears the progress line, which the next Add draws again below it.
// Without a terminal it returns w.
func (r *Reporter) Writer(w io.Writer) io.Writer {
	if r.cfg.Terminal == nil {
		return w
	}
	return clearing{r: r, w: w}
}

type clearing struct {
	r *Reporter
	w io.Writer
}

func (c clearing) Write(p []byte) (int, error) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if c.r.shown {
		fmt.Fprint(c.r.cfg.Terminal, "\r\033[K")
		c.r.shown = false
	}
	return c.w.Write(p)
}

// rate returns the count done per second since the start, 0 before any
// time passed.
func (r *Reporter) rate(now time.Time) float64 {
	secs := now.Sub(r.start).Seconds()
	if secs <= 0 {
		return 0
	}
	return float64(r.done) / secs
}

// left returns the time left at the current rate, and false when it is
// not known (no total, nothing done yet).
func (r *Reporter) left(now time.Time) (time.Duration, bool) {
	rate := r.rate(now)
	if r.total == 0 || rate <= 0 {
		return 0, false
	}
	rest := float64(max(r.total-r.done, 0)) / rate
	if rest > float64(math.MaxInt64/int64(time.Second)) {
		return 0, false
	}
	return time.Duration(rest * float64(time.Second)), true
}

// line is the terminal line: "replay: 1,234 / 5,000 events  24.7%
// 123/s  30s left", or without a total "purge: 1,234 rows  123/s  10s".
func (r *Reporter) line(now time.Time) string {
	var b strings.Builder
	b.WriteString(r.cfg.Name + ": " + Group(r.done))
	if r.total > 0 {
		fmt.Fprintf(&b, " / %s %s  %s", Group(r.total), r.cfg.Unit, percent(r.done, r.total))
	} else {
		b.WriteString(" " + r.cfg.Unit)
	}
	b.WriteString("  " + Rate(r.rate(now)))
	if d, ok := r.left(now); ok {
		b.WriteString("  " + Duration(d) + " left")
	} else {
		b.WriteString("  " + Duration(now.Sub(r.start)))
	}
	return b.String()
}

// summary is the terminal's last line: "replay: 5,000 of 5,000 events in
// 40s (125/s), 2 errors".
func (r *Reporter) summary(now time.Time, counts []Count) string {
	var b strings.Builder
	b.WriteString(r.cfg.Name + ": " + Group(r.done))
	if r.total > 0 {
		b.WriteString(" of " + Group(r.total))
	}
	fmt.Fprintf(&b, " %s in %s (%s)", r.cfg.Unit, Duration(now.Sub(r.start)), Rate(r.rate(now)))
	for _, c := range counts {
		if c.N != 0 {
			fmt.Fprintf(&b, ", %s %s", Group(c.N), c.Name)
		}
	}
	return b.String()
}

// attrs are a log line's: the count under the unit's name, the total and
// percent when known, the rate, the elapsed time, and the time left while
// it runs.
func (r *Reporter) attrs(now time.Time, final bool) []any {
	unit := strings.ReplaceAll(r.cfg.Unit, " ", "_")
	a := []any{unit, r.done}
	if r.total > 0 {
		a = append(a, "total", r.total, "percent", math.Round(1000*float64(min(r.done, r.total))/float64(r.total))/10)
	}
	a = append(a, "per_second", math.Round(r.rate(now)*10)/10, "elapsed", round(now.Sub(r.start)))
	if d, ok := r.left(now); ok && !final {
		a = append(a, "left", round(d))
	}
	return a
}

// percent formats done/total as "24.7%", at most 100%.
func percent(done, total int64) string {
	return strconv.FormatFloat(100*float64(min(done, total))/float64(total), 'f', 1, 64) + "%"
}

// Group formats n with thousands separators: 1,234,567.
func Group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// Rate formats a rate per second: "12,345/s", "2.5/s".
func Rate(perSec float64) string {
	if perSec < 10 {
		return strconv.FormatFloat(perSec, 'f', 1, 64) + "/s"
	}
	return Group(int64(math.Round(perSec))) + "/s"
}

// Duration formats d for a person: "850ms", "12s", "3m05s", "13h30m".
func Duration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	d = d.Round(time.Minute)
	return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

// round rounds a duration for a log line: to the millisecond under a
// second, to the second above.
func round(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}
