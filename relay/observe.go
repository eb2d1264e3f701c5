package relay

import (
	"context"
	"time"

	"github.com/idem-go/idem"
)

// publish publishes msgs through the broker, counting them in flight and
// timing the call for Config.ObservePublish.
func (r *Relay[TTx]) publish(ctx context.Context, msgs []idem.Message) error {
	n := int64(len(msgs))
	r.stats.inFlight.Add(n)
	defer r.stats.inFlight.Add(-n)
	defer observeSince(r.cfg.ObservePublish, time.Now())
	return r.pub.Publish(ctx, msgs)
}

// observeSince calls f, when set, with the time since start.
func observeSince(f func(time.Duration), start time.Time) {
	if f != nil {
		f(time.Since(start))
	}
}
