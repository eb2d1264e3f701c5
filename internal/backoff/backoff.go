// Package backoff computes the waits between attempts of every retry loop in
// idem (relays, subscribers, listeners, the consumer's pause): exponential
// growth with "equal jitter", and a plain jitter for poll intervals, so that
// processes that failed together do not retry together; and the same growth
// without jitter for the short polls of one process (Doubled).
package backoff

import (
	"math/rand/v2"
	"time"
)

// maxShift bounds the doubling, so that base<<shift cannot overflow.
const maxShift = 20

// Exponential returns base doubled attempt-1 times, capped at max, with
// "equal jitter": a random duration between half of it and all of it.
// Attempts below 1 count as 1; a base of 0 or less waits 0; a max of 0 or less leaves the wait uncapped
// (up to base<<20).
func Exponential(base, max time.Duration, attempt int) time.Duration {
	d := Doubled(base, max, attempt)
	if d <= 0 {
		return 0
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}

// Doubled is Exponential without the jitter: base doubled attempt-1 times,
// capped at max (0 when base is 0 or less). It is for a loop that polls for something expected within
// moments (a transaction becoming visible), whose waits no other process
// shares, so that spreading them gains nothing and each wait stays as short
// as planned.
func Doubled(base, max time.Duration, attempt int) time.Duration {
	if base <= 0 {
		return 0
	}
	shift := min(max0(attempt-1), maxShift)
	d := base << shift
	if max > 0 && (d > max || d <= 0) {
		d = max
	}
	return max0d(d)
}

// Jitter returns d changed by a random fraction in [-f, +f].
func Jitter(d time.Duration, f float64) time.Duration {
	return time.Duration(float64(d) * (1 + f*(2*rand.Float64()-1)))
}

// Backoff counts the failures in a row of one loop and returns the wait
// before the next attempt. The zero value is not usable; set Base and Max.
type Backoff struct {
	// Base is the first wait (before jitter); Max caps the waits.
	Base, Max time.Duration
	failures  int
}

// Next records a failure and returns the wait before the next attempt.
func (b *Backoff) Next() time.Duration {
	b.failures++
	return Exponential(b.Base, b.Max, b.failures)
}

// Failures returns the failures in a row recorded since the last Reset.
func (b *Backoff) Failures() int { return b.failures }

// Reset records a success: the next failure waits Base again.
func (b *Backoff) Reset() { b.failures = 0 }

func max0d(d time.Duration) time.Duration {
	if d < 0 {
		return 0
	}
	return d
}

func max0(n int) int {
	if n < 0 {
		return 0
	}
	return n
}
