package errlog

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config.
const (
	// IntervalDefault is the shortest time between two lines of one cause.
	IntervalDefault = 10 * time.Second
	// MaxCausesDefault is how many causes a Limiter remembers.
	MaxCausesDefault = 32
)

// maxKeyText is how much of an error's text tells its cause.
const maxKeyText = 256

// Config configures a Limiter. The zero value is valid.
type Config struct {
	// Interval is the shortest time between two lines of one cause: the
	// repeats within it are counted and logged in the next line, the first
	// repeat after it. Defaults to IntervalDefault (10s).
	Interval time.Duration
	// MaxCauses is how many causes a Limiter remembers; failures of other
	// causes are counted together. Defaults to MaxCausesDefault (32).
	MaxCauses int
}

// WithDefaults returns c with its zero (or negative) fields set to their
// defaults.
func (c Config) WithDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = IntervalDefault
	}
	if c.MaxCauses <= 0 {
		c.MaxCauses = MaxCausesDefault
	}
	return c
}

// Limiter logs the failures of one operation (the requests of a service, a
// relay's claims, a subscriber's reconnections): the first failure of each
// cause at once, its repeats counted and logged at most once per
// Config.Interval, and one "recovered" line at the success that follows
// (see the package documentation). Create it with New. It is safe for
// concurrent use.
type Limiter struct {
	log  *slog.Logger
	what string
	cfg  Config
	now  func() time.Time

	// failing is set from a failure to the next success; OK reads it
	// without the lock.
	failing atomic.Bool

	mu     sync.Mutex
	causes map[string]*cause
	other  *cause // the causes beyond Config.MaxCauses, together
	// since is the first failure after the last success; failures counts
	// the failures since the last recovered line, and logged says whether
	// a line was logged since then.
	since    time.Time
	failures int64
	logged   bool
}

// cause is what a Limiter remembers of one cause.
type cause struct {
	lastLine time.Time // its last line
	pending  int64     // its failures since then
	// recovered is set when a recovered line came after lastLine: its
	// next line, if it has nothing more to count, is a first line.
	recovered bool
}

// New returns a Limiter that logs on log (slog.Default() when nil) the
// failures of an operation that what names, for the recovered line
// ("order requests" logs "order requests recovered").
func New(log *slog.Logger, what string, cfg Config) *Limiter {
	if log == nil {
		log = slog.Default()
	}
	if what == "" {
		what = "operation"
	}
	return &Limiter{log: log, what: what, cfg: cfg.WithDefaults(), now: time.Now, causes: map[string]*cause{}}
}

// Error records a failure, logged at slog.LevelError when it is the first
// of its cause or the first repeat after Config.Interval: msg with attrs
// (slog's key-value pairs) and "error", err. The cause is msg and err's
// text, its digits masked.
func (l *Limiter) Error(ctx context.Context, msg string, err error, attrs ...any) {
	l.fail(ctx, slog.LevelError, msg, err, attrs)
}

// Warn is Error at slog.LevelWarn.
func (l *Limiter) Warn(ctx context.Context, msg string, err error, attrs ...any) {
	l.fail(ctx, slog.LevelWarn, msg, err, attrs)
}

// Log is Error at level.
func (l *Limiter) Log(ctx context.Context, level slog.Level, msg string, err error, attrs ...any) {
	l.fail(ctx, level, msg, err, attrs)
}

// OK records a success of the operation. After failures of which a line
// was logged, it logs "<what> recovered" at slog.LevelInfo, with failed_for
// and failures. While nothing fails it costs an atomic load: call it on
// every success.
func (l *Limiter) OK(ctx context.Context) {
	if l.failing.Load() {
		l.recovered(ctx)
	}
}

func (l *Limiter) fail(ctx context.Context, level slog.Level, msg string, err error, attrs []any) {
	key := causeKey(msg, err)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.failing.Load() {
		l.failing.Store(true)
		l.since = now
	}
	l.failures++
	c := l.causes[key]
	if c == nil {
		if len(l.causes) >= l.cfg.MaxCauses {
			l.forget(now, false)
		}
		switch {
		case len(l.causes) < l.cfg.MaxCauses:
			l.causes[key] = &cause{lastLine: now}
		case l.other == nil:
			l.other = &cause{lastLine: now}
		default:
			c = l.other
		}
	}
	if c == nil { // a new cause: its first line
		l.logged = true
		l.emit(ctx, level, msg, attrs, err)
		return
	}
	c.pending++
	over := now.Sub(c.lastLine)
	if over < l.cfg.Interval {
		return
	}
	if c.recovered && c.pending == 1 { // a new outage: a first line again
		l.logged = true
		l.emit(ctx, level, msg, attrs, err)
		c.pending, c.lastLine, c.recovered = 0, now, false
		return
	}
	repeated := "repeated"
	if c == l.other {
		repeated = "other_causes_repeated"
	}
	l.logged = true
	l.emit(ctx, level, msg, attrs, err, repeated, c.pending, "over", over.Round(time.Millisecond))
	c.pending, c.lastLine, c.recovered = 0, now, false
}

func (l *Limiter) recovered(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.failing.Load() {
		return
	}
	l.failing.Store(false)
	if !l.logged {
		// Only counted failures: the next line counts them.
		return
	}
	now := l.now()
	l.emit(ctx, slog.LevelInfo, l.what+" recovered", nil, nil,
		"failed_for", now.Sub(l.since).Round(time.Millisecond), "failures", l.failures)
	l.failures, l.logged = 0, false
	l.forget(now, true)
}

// forget removes the causes whose last line is an interval old or more and
// that have no failures left to report. With counted set (a recovered line
// counted every failure), every cause's count is cleared first, and the
// next line of those it keeps is a first line again unless it has repeats
// to count.
func (l *Limiter) forget(now time.Time, counted bool) {
	if counted {
		for _, c := range l.causes {
			c.pending, c.recovered = 0, true
		}
		if l.other != nil {
			l.other.pending, l.other.recovered = 0, true
		}
	}
	stale := func(c *cause) bool { return c.pending == 0 && now.Sub(c.lastLine) >= l.cfg.Interval }
	for k, c := range l.causes {
		if stale(c) {
			delete(l.causes, k)
		}
	}
	if l.other != nil && stale(l.other) {
		l.other = nil
	}
}

// emit logs one line, attributed to the caller of the exported method
// (four frames up: runtime.Callers, emit, fail or recovered, the method).
func (l *Limiter) emit(ctx context.Context, level slog.Level, msg string, attrs []any, err error, extra ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	if !l.log.Enabled(ctx, level) {
		return
	}
	var pcs [1]uintptr
	runtime.Callers(4, pcs[:])
	r := slog.NewRecord(l.now(), level, msg, pcs[0])
	r.Add(attrs...)
	if err != nil {
		r.Add("error", err)
	}
	r.Add(extra...)
	_ = l.log.Handler().Handle(ctx, r)
}

// causeKey returns the cause of a failure: msg and the start of err's text,
// each run of digits replaced by '#' (ports, addresses, counts and ids do
// not make a new cause).
func causeKey(msg string, err error) string {
	if err == nil {
		return msg
	}
	text := err.Error()
	if len(text) > maxKeyText {
		text = text[:maxKeyText]
	}
	var b strings.Builder
	b.Grow(len(msg) + 1 + len(text))
	b.WriteString(msg)
	b.WriteByte(0)
	digits := false
	for i := 0; i < len(text); i++ {
		ch := text[i]
		if '0' <= ch && ch <= '9' {
			if !digits {
				b.WriteByte('#')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteByte(ch)
	}
	return b.String()
}
