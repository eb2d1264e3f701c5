package kafka_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/internal/startstop/startstoptest"
)

// A Stop while Start waits for a broker that does not answer ends the
// start-up: Start fails, Stop returns, nothing leaks.
func TestStopDuringStart(t *testing.T) {
	startstoptest.StopDuringStart(t, func(t *testing.T) (startstoptest.Service, <-chan struct{}) {
		addr, accepted := startstoptest.SilentListener(t)
		sub, err := kafka.NewSubscriber(subscriberConfig([]string{addr}, "lifecycle", "events"), ackEverything)
		if err != nil {
			t.Fatal(err)
		}
		return sub, accepted
	})
}

func ackEverything(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	out := make([]broker.Disposition, len(ds))
	for i := range out {
		out[i] = broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
	}
	return out, make([]error, len(ds))
}
