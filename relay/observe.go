package relay

import (
	"context"
	"time"

	"github.com/idem-go/idem"
)

// Observer is told what a relay does, for metrics: package
// relay/relaymetrics makes one that feeds Prometheus. Set it as
// Config.Observer. The relay calls its functions from every worker at once:
// they must be fast and safe for concurrent use. A nil function is not
// called; the zero Observer costs nothing.
type Observer struct {
	// Delay is called for every published row with the time from the row's
	// insertion (the start of its transaction) to the broker's
	// confirmation.
	Delay func(time.Duration)
	// Claim, Publish and Mark are called with the duration of each claim
	// (its transaction or statement, claims that find nothing included), of
	// each Publish call (until the broker confirmed or refused every
	// message), and of each marking of a batch's confirmed rows as
	// published (retries included).
	Claim, Publish, Mark func(time.Duration)
}

// publish publishes msgs through the broker, counting them in flight and
// timing the call for Observer.Publish.
func (r *Relay[TTx]) publish(ctx context.Context, msgs []idem.Message) error {
	n := int64(len(msgs))
	r.stats.inFlight.Add(n)
	defer r.stats.inFlight.Add(-n)
	defer observeSince(r.cfg.Observer.Publish, time.Now())
	return r.pub.Publish(ctx, msgs)
}

// observeSince calls f, when set, with the time since start.
func observeSince(f func(time.Duration), start time.Time) {
	if f != nil {
		f(time.Since(start))
	}
}
