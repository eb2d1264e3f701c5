package idemtest

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when told to, for the consumer's pauses
// and outage budget (inbox.Config.Now), the outbox writer's OccurredAt
// (outbox.Writer.WithClock) and purges (inbox.PurgeConfig.Now). It is safe
// for concurrent use.
//
// Timestamps the database writes itself (a marker's processed_at, a parked
// message's failure times) follow the database's clock: start a Clock at
// the current time (NewClock) so that the two agree until the test moves
// it.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock standing at the current time, to the
// microsecond (the databases' precision).
func NewClock() *Clock {
	return &Clock{now: time.Now().UTC().Truncate(time.Microsecond)}
}

// NewClockAt returns a clock standing at t.
func NewClockAt(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time. It is the func() time.Time the Config
// fields take: inbox.Config{Now: clock.Now}.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and returns the new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// Set moves the clock to t, forward or back.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
