package registry

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/startstop/startstoptest"
)

// A Stop while the NATS subscriber's Start waits for JetStream (a server
// that answers no request) ends the start-up and releases the connection.
func TestNATSSubscriberStopDuringStart(t *testing.T) {
	startstoptest.StopDuringStart(t, func(t *testing.T) (startstoptest.Service, <-chan struct{}) {
		url, requested := startstoptest.SilentNATS(t)
		return subscribeForLifecycle(t, url), requested
	})
}

// A Stop while the Kafka subscriber's Start creates its topics (a broker
// that does not answer) ends the start-up.
func TestKafkaSubscriberStopDuringStart(t *testing.T) {
	startstoptest.StopDuringStart(t, func(t *testing.T) (startstoptest.Service, <-chan struct{}) {
		addr, accepted := startstoptest.SilentListener(t)
		return subscribeForLifecycle(t, "kafka://"+addr), accepted
	})
}

func subscribeForLifecycle(t *testing.T, url string) broker.Subscriber {
	t.Helper()
	sub, err := Subscribe(url, SubscribeConfig{Consumer: "stock", EventNames: []string{"order.order.placed.v1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		func(context.Context, []broker.Delivery) ([]broker.Disposition, []error) {
			t.Error("a subscriber stopped during its start-up delivered a message")
			return nil, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return sub
}
