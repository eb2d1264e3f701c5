package inbox

import (
	"fmt"
	"math"
	"time"

	"github.com/idem-go/idem/internal/backoff"
)

// Retry policy defaults, the same as Symfony Messenger's.
const (
	MaxRetriesDefault   = 3
	InitialDelayDefault = time.Second
	MultiplierDefault   = 2.0
	MaxDelayDefault     = time.Minute
	JitterDefault       = 0.1
)

// RetryPolicy says how often and when a failed delivery is tried again before
// it is parked in the failure store. Delivery attempts are numbered from 1; a
// message is attempted at most MaxRetries+1 times.
type RetryPolicy struct {
	// MaxRetries is how many times a failed delivery is retried. Defaults to
	// 3; set a negative value for no retry at all.
	MaxRetries int
	// InitialDelay is the delay before the first retry. Defaults to 1s.
	InitialDelay time.Duration
	// Multiplier multiplies the delay at each retry. Defaults to 2.
	Multiplier float64
	// MaxDelay caps the delay. Defaults to 1m.
	MaxDelay time.Duration
	// Jitter is the fraction of the delay added or removed at random, so that
	// failures at one moment do not all retry at one moment. Defaults to 0.1;
	// set a negative value for none.
	Jitter float64
}

// WithDefaults returns p with zero fields set to their defaults.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.MaxRetries == 0 {
		p.MaxRetries = MaxRetriesDefault
	}
	if p.InitialDelay == 0 {
		p.InitialDelay = InitialDelayDefault
	}
	if p.Multiplier == 0 {
		p.Multiplier = MultiplierDefault
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = MaxDelayDefault
	}
	if p.Jitter == 0 {
		p.Jitter = JitterDefault
	}
	return p
}

func (p RetryPolicy) validate() error {
	switch {
	case p.InitialDelay < 0:
		return fmt.Errorf("idem: inbox: RetryPolicy.InitialDelay %v is negative", p.InitialDelay)
	case p.MaxDelay < 0:
		return fmt.Errorf("idem: inbox: RetryPolicy.MaxDelay %v is negative", p.MaxDelay)
	case p.Multiplier < 0 || (p.Multiplier > 0 && p.Multiplier < 1):
		return fmt.Errorf("idem: inbox: RetryPolicy.Multiplier %v must be at least 1", p.Multiplier)
	case p.Jitter > 1:
		return fmt.Errorf("idem: inbox: RetryPolicy.Jitter %v must be at most 1", p.Jitter)
	}
	return nil
}

// MaxAttempts returns how many times a message is attempted in all.
func (p RetryPolicy) MaxAttempts() int {
	p = p.WithDefaults()
	if p.MaxRetries < 0 {
		return 1
	}
	return p.MaxRetries + 1
}

// Retry reports whether a delivery that failed at attempt (1-based) gets
// another attempt.
func (p RetryPolicy) Retry(attempt int) bool {
	return attempt < p.MaxAttempts()
}

// Delay returns how long to wait before the attempt after attempt: the
// initial delay times multiplier^(attempt-1), capped, with jitter.
//
// It grows by the policy's own Multiplier, with its own Jitter either side,
// rather than by backoff.Exponential (doubling, between half the delay and
// all of it): the policy is the application's, documented field by field.
func (p RetryPolicy) Delay(attempt int) time.Duration {
	p = p.WithDefaults()
	if attempt < 1 {
		attempt = 1
	}
	d := float64(p.InitialDelay) * math.Pow(p.Multiplier, float64(attempt-1))
	if d > float64(p.MaxDelay) || math.IsInf(d, 0) || math.IsNaN(d) {
		d = float64(p.MaxDelay)
	}
	if p.Jitter > 0 {
		return backoff.Jitter(time.Duration(d), p.Jitter)
	}
	return time.Duration(d)
}
