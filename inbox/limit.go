package inbox

import (
	"context"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/idem-go/idem"
)

// RateWaitMaxDefault is how long a delivery waits for a rate or
// concurrency limit before it is handed back to its transport
// (Config.RateWaitMax).
const RateWaitMaxDefault = 5 * time.Second

// keyLimitersMax bounds the per-key limiters a consumer keeps; past it, the
// idle ones (their bucket full again) are dropped.
const keyLimitersMax = 10_000

// limits are a consumer's rate and concurrency limits (Config.RateLimit,
// KeyLimit, MaxConcurrent); nil when it has none.
type limits struct {
	all      *rate.Limiter // nil: no global limit
	keyRate  rate.Limit    // 0: no per-key limit
	keyBurst int
	key      func(idem.Event) string
	slots    chan struct{} // nil: no concurrency limit
	waitMax  time.Duration

	mu   sync.Mutex
	keys map[string]*rate.Limiter
}

// newLimits returns cfg's limits, nil when it sets none.
func newLimits(cfg Config) *limits {
	if cfg.RateLimit == 0 && cfg.KeyLimit == 0 && cfg.MaxConcurrent == 0 {
		return nil
	}
	l := &limits{waitMax: cfg.RateWaitMax, key: cfg.Key}
	if cfg.RateLimit > 0 {
		l.all = rate.NewLimiter(rate.Limit(cfg.RateLimit), cfg.RateBurst)
	}
	if cfg.KeyLimit > 0 {
		l.keyRate, l.keyBurst, l.keys = rate.Limit(cfg.KeyLimit), cfg.KeyBurst, map[string]*rate.Limiter{}
		if l.key == nil {
			l.key = AggregateKey
		}
	}
	if cfg.MaxConcurrent > 0 {
		l.slots = make(chan struct{}, cfg.MaxConcurrent)
	}
	return l
}

// AggregateKey is the default Config.Key: the event's aggregate type and
// id, "" (no per-key limit) for an event without an aggregate id.
func AggregateKey(ev idem.Event) string {
	if ev.AggregateID == "" {
		return ""
	}
	return ev.AggregateType + "\x00" + ev.AggregateID
}

// burstFor returns the default burst of a rate: one second's worth, at
// least 1.
func burstFor(r float64) int {
	if r <= 0 || r > math.MaxInt32 {
		return 1
	}
	return max(1, int(math.Ceil(r)))
}

// limited is why admit did not let a delivery through.
type limited int

const (
	admitted limited = iota
	// overRate: the consumer's rate; hand back everything (Pause).
	overRate
	// overKey: the event's key's rate; hand back this key (Retry,
	// Deferred).
	overKey
	// overSlots: no concurrency slot came free in time (Pause).
	overSlots
	// cancelled: ctx ended while waiting.
	cancelled
)

// admit waits until ev may be processed under the limits, at most
// waitMax, and returns admitted with the function that releases its
// concurrency slot; or, without waiting that long, why not and how long
// until it may be tried again. The token taken from a rate is given back
// when the delivery does not go through.
func (l *limits) admit(ctx context.Context, ev idem.Event) (limited, time.Duration, time.Duration, func()) {
	now := time.Now()
	var waited time.Duration
	var rs []*rate.Reservation
	cancelAll := func() {
		for _, r := range rs {
			r.CancelAt(now)
		}
	}
	delay := time.Duration(0)
	if l.all != nil {
		r := l.all.ReserveN(now, 1)
		if !r.OK() {
			return overRate, 0, time.Second, noop
		}
		rs = append(rs, r)
		delay = r.DelayFrom(now)
		if delay > l.waitMax {
			cancelAll()
			return overRate, 0, delay, noop
		}
	}
	if kl := l.forKey(ev); kl != nil {
		r := kl.ReserveN(now, 1)
		if !r.OK() {
			cancelAll()
			return overKey, 0, time.Second, noop
		}
		rs = append(rs, r)
		if d := r.DelayFrom(now); d > l.waitMax {
			cancelAll()
			return overKey, 0, d, noop
		} else if d > delay {
			delay = d
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
			waited += delay
		case <-ctx.Done():
			t.Stop()
			cancelAll()
			return cancelled, 0, 0, noop
		}
	}
	if l.slots == nil {
		return admitted, waited, 0, noop
	}
	select {
	case l.slots <- struct{}{}:
		return admitted, waited, 0, func() { <-l.slots }
	default:
	}
	start := time.Now()
	t := time.NewTimer(l.waitMax)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		return admitted, waited + time.Since(start), 0, func() { <-l.slots }
	case <-t.C:
		// The tokens are spent: the delivery was due, and is handed back
		// for want of a slot.
		return overSlots, waited + time.Since(start), 100 * time.Millisecond, noop
	case <-ctx.Done():
		return cancelled, waited + time.Since(start), 0, noop
	}
}

// forKey returns the limiter of ev's key, nil without a per-key limit.
func (l *limits) forKey(ev idem.Event) *rate.Limiter {
	if l.keyRate == 0 {
		return nil
	}
	k := l.key(ev)
	if k == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	kl, ok := l.keys[k]
	if !ok {
		if len(l.keys) >= keyLimitersMax {
			now := time.Now()
			for key, v := range l.keys {
				if v.TokensAt(now) >= float64(l.keyBurst) {
					delete(l.keys, key)
				}
			}
			for key := range l.keys {
				if len(l.keys) < keyLimitersMax {
					break
				}
				delete(l.keys, key)
			}
		}
		kl = rate.NewLimiter(l.keyRate, l.keyBurst)
		l.keys[k] = kl
	}
	return kl
}
