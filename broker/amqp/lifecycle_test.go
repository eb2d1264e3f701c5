package amqp_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/startstop/startstoptest"
)

// A Stop while Start waits for the broker's handshake ends the start-up:
// Start fails, Stop returns, nothing leaks.
func TestStopDuringStart(t *testing.T) {
	startstoptest.StopDuringStart(t, func(t *testing.T) (startstoptest.Service, <-chan struct{}) {
		addr, accepted := startstoptest.SilentListener(t)
		cfg := subscriberConfig("amqp://guest:guest@"+addr+"/", "events", "lifecycle", "#")
		cfg.DialTimeout = time.Hour // only the Stop can end the handshake
		cfg.Logger = brokertest.Logger()
		return newSubscriber(t, cfg, ackAll), accepted
	})
}

// A Stop racing Start on a real broker: Start ends (with an error, or
// started and then stopped at once), Stop returns.
func TestStopRacesStart(t *testing.T) {
	b := setup(t)
	startstoptest.StopDuringStart(t, func(t *testing.T) (startstoptest.Service, <-chan struct{}) {
		cfg := subscriberConfig(b.url, b.exchange, b.queue, "#")
		cfg.Logger = brokertest.Logger()
		held := make(chan struct{})
		close(held)
		return newSubscriber(t, cfg, ackAll), held
	})
}

func ackAll(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	out := make([]broker.Disposition, len(ds))
	for i := range out {
		out[i] = broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
	}
	return out, make([]error, len(ds))
}
