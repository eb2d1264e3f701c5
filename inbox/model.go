package inbox

import (
	"bytes"
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"hash/fnv"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	idemdriver "github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/backoff"
)

// failureClass is what a failure means for the message.
type failureClass int

const (
	// counted: a handler failed; the retry policy counts the attempt.
	counted failureClass = iota
	// permanent: retrying cannot help; park at once.
	permanent
	// transient: a dependency (the consumer's database, a downstream
	// service) is away for now; pause, count nothing.
	transient
	// stopping: the caller's context ended (the transport stops).
	stopping
)

// classify sorts err, returned by processing an event under ctx.
func (c *Consumer[TTx]) classify(ctx context.Context, err error) failureClass {
	switch {
	case idem.IsPermanent(err):
		return permanent
	case ctx.Err() != nil:
		return stopping
	case c.isTransient(err):
		return transient
	}
	return counted
}

// isTransient reports whether err says a dependency is away for now: a
// handler said so (idem.Transient), the database did (its dialect's error
// classes), the network did, or the delivery timed out.
func (c *Consumer[TTx]) isTransient(err error) bool {
	return idem.IsTransient(err) || c.drv.Dialect().IsTransient(err) || isNetworkError(err) ||
		errors.Is(err, context.DeadlineExceeded)
}

// isNetworkError reports whether err is a failure to reach or keep talking
// to another process.
func isNetworkError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, driver.ErrBadConn)
}

// gate pauses the whole consumer after a transient failure: until it ends,
// deliveries are answered Pause without touching the database, and the
// first delivery after it is the probe. Pauses grow exponentially, with
// jitter within [d/2, d] so that consumers paused together do not probe
// together, from Config.PauseMin to PauseMax (pauses.Base, pauses.Max),
// and reset on the first success.
type gate struct {
	now func() time.Time // the consumer's clock (Config.Now)

	mu     sync.Mutex
	until  time.Time
	since  time.Time       // start of the current pause; zero while running
	pauses backoff.Backoff // the transient failures in a row
}

// wait returns how long the pause has left, 0 when not paused.
func (g *gate) wait() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return max(g.until.Sub(g.now()), 0)
}

// fail records a transient failure and returns the pause it starts, and
// whether the consumer was running until now.
func (g *gate) fail() (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	first := g.since.IsZero()
	if first {
		g.since = now
	}
	d := g.pauses.Next()
	if until := now.Add(d); until.After(g.until) {
		g.until = until
	}
	return g.until.Sub(now), first
}

// ok records a success and returns how long the consumer had been paused
// (0 when it was running).
func (g *gate) ok() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.since.IsZero() {
		return 0
	}
	d := g.now().Sub(g.since)
	g.since, g.until = time.Time{}, time.Time{}
	g.pauses.Reset()
	return d
}

func (g *gate) pausedSince() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.since
}

// eventTimes is a bounded set of event ids with a time each.
type eventTimes struct {
	mu sync.Mutex
	m  map[uuid.UUID]time.Time
}

// eventTimesMax bounds an eventTimes: entries beyond it are dropped, oldest
// first (a consumer never holds that many events at once).
const eventTimesMax = 100_000

// first returns the time recorded for id, recording now if there is none.
func (e *eventTimes) first(id uuid.UUID, now time.Time) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t, ok := e.m[id]; ok {
		return t
	}
	if e.m == nil {
		e.m = map[uuid.UUID]time.Time{}
	}
	if len(e.m) >= eventTimesMax {
		var oldest uuid.UUID
		var at time.Time
		for k, t := range e.m {
			if at.IsZero() || t.Before(at) {
				oldest, at = k, t
			}
		}
		delete(e.m, oldest)
	}
	e.m[id] = now
	return now
}

// forget removes id and reports whether it was there.
func (e *eventTimes) forget(id uuid.UUID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.m[id]
	delete(e.m, id)
	return ok
}

// parkedCache remembers, for a second, whether the consumer has parked
// messages that hold their aggregate, so that a consumer with none pays
// nothing per delivery.
type parkedCache struct {
	mu  sync.Mutex
	at  time.Time
	has bool
}

// parkedCacheTTL is how long parkedCache trusts its answer: how late a
// consumer process learns of an aggregate held by another process.
const parkedCacheTTL = time.Second

func (p *parkedCache) get(query func() (bool, error)) (bool, error) {
	p.mu.Lock()
	if time.Since(p.at) < parkedCacheTTL {
		has := p.has
		p.mu.Unlock()
		return has, nil
	}
	p.mu.Unlock()
	has, err := query()
	if err != nil {
		return false, err
	}
	p.mu.Lock()
	p.has, p.at = has, time.Now()
	p.mu.Unlock()
	return has, nil
}

// set records that the consumer has a parked message holding an aggregate.
func (p *parkedCache) set() {
	p.mu.Lock()
	p.has, p.at = true, time.Now()
	p.mu.Unlock()
}

// contentHash returns a 64-bit hash of what makes an event besides its id
// (name, aggregate, content type when set, a JSON payload with insignificant
// whitespace removed, other bytes as they are), kept with
// its marker to notice an id that comes back with other content. It is never
// 0, which means "unknown".
func contentHash(ev idem.Event) int64 {
	h := fnv.New64a()
	for _, s := range []string{ev.Name, ev.AggregateType, ev.AggregateID} {
		_, _ = io.WriteString(h, s)
		_, _ = h.Write([]byte{0})
	}
	if ev.ContentType != "" {
		// Only then: the hashes of events without one stay as they were.
		_, _ = io.WriteString(h, ev.ContentType)
		_, _ = h.Write([]byte{0})
	}
	var buf bytes.Buffer
	if ev.IsJSON() && json.Compact(&buf, ev.Payload) == nil {
		_, _ = h.Write(buf.Bytes())
	} else {
		_, _ = h.Write(ev.Payload)
	}
	v := int64(h.Sum64())
	if v == 0 {
		v = 1
	}
	return v
}

// checkContent compares the content of duplicates with what their markers
// recorded, and logs and counts those that differ: the same event id sent
// with other content is a producer's bug (an id reused, generated on
// receipt...) that deduplication would otherwise hide.
func (c *Consumer[TTx]) checkContent(ctx context.Context, ex idemdriver.Executor, dups []idem.Event, hashes []int64) error {
	ids := make([]uuid.UUID, len(dups))
	for i, ev := range dups {
		ids[i] = ev.ID
	}
	stored, err := c.drv.Dialect().ProcessedHashes(ctx, ex, c.cfg.Name, ids)
	if err != nil {
		return err
	}
	for i, ev := range dups {
		if h, ok := stored[ev.ID]; ok && h != 0 && h != hashes[i] {
			c.stats.conflicts.Add(1)
			c.log.Warn("event id received again with different content; skipped as a duplicate: its producer reuses ids",
				"event_id", ev.ID, "event_name", ev.Name, "aggregate_type", ev.AggregateType, "aggregate_id", ev.AggregateID,
				"first_content_hash", h, "content_hash", hashes[i])
		}
	}
	return nil
}
