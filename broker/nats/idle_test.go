package nats_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
)

// TestIdleSubscriberLongPolls: an idle subscriber keeps one long pull
// request open at the server instead of fetching in a loop (at most one
// request in 3 s; a loop of short fetches would make dozens), and a message
// published meanwhile is delivered at once, through the request that waits.
func TestIdleSubscriberLongPolls(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	pub := newPublisher(t, srv.url(), n.stream)

	// Every pull request of the consumer, as the server receives it.
	watch, err := natsgo.Connect(srv.url())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	var pulls atomic.Int64
	if _, err := watch.Subscribe("$JS.API.CONSUMER.MSG.NEXT."+n.stream.Name+".idle", func(*natsgo.Msg) { pulls.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}

	got := make(chan time.Time, 10)
	subscribe(t, srv.url(), n.stream, "idle", func(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		disps := make([]broker.Disposition, len(ds))
		for i := range ds {
			got <- time.Now()
			disps[i].Action = broker.Ack
		}
		return disps, make([]error, len(ds))
	})
	deadline := time.Now().Add(10 * time.Second)
	for pulls.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if pulls.Load() == 0 {
		t.Fatal("the subscriber sent no pull request")
	}

	// Idle for 3 s: watch what the subscriber asks for meanwhile.
	before := pulls.Load()
	time.Sleep(3 * time.Second)
	if idle := pulls.Load() - before; idle > 1 {
		t.Errorf("an idle subscriber sent %d pull requests in 3 s; want at most 1 (one long poll)", idle)
	}

	sent := time.Now()
	brokertest.Publish(t, pub, brokertest.NewMessage(t, "order.order.placed.v1", "1", 0))
	select {
	case at := <-got:
		if d := at.Sub(sent); d > time.Second {
			t.Errorf("delivered %v after the publish; want it at once", d)
		} else {
			t.Logf("delivered %v after the publish", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the message was not delivered")
	}
}
