package nats_test

import (
	"testing"

	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/internal/startstop/startstoptest"
)

// A Stop while Start waits for JetStream's answer (a server that answers
// none) ends the start-up: Start fails, Stop returns, nothing leaks.
func TestStopDuringStart(t *testing.T) {
	startstoptest.StopDuringStart(t, func(t *testing.T) (startstoptest.Service, <-chan struct{}) {
		url, requested := startstoptest.SilentNATS(t)
		sub, err := nats.NewSubscriber(nats.SubscriberConfig{
			ConnConfig: nats.ConnConfig{URL: url, Logger: brokertest.Logger()},
			Stream:     newNames().stream,
			Consumer:   "lifecycle",
		}, ackAll)
		if err != nil {
			t.Fatal(err)
		}
		return sub, requested
	})
}
