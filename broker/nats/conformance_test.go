package nats_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/internal/fault"
)

// conformanceAckWait is the AckWait of the suite's subscribers, short so
// that JetStream delivers again soon the messages of the consumer it kills.
const conformanceAckWait = time.Second

func TestConformance(t *testing.T) {
	srv := startServer(t)
	brokertest.Run(t, brokertest.Transport{
		New: func(t *testing.T, o brokertest.Options) brokertest.Instance { return newConformanceInstance(t, srv, o) },
		Features: brokertest.Features{
			PerKeyOrder:         true,
			Redeliver:           true,
			ConsumerPublisher:   true,
			PublishDeduplicates: true,
			// The subscriber that takes a durable consumer over (after
			// a kill, or a restart) creates it again from its
			// acknowledgement floor: JetStream's delivery count starts
			// again at 1.
			DeliveryCount: false,
			Inspect:       true,
			Restart:       func(t *testing.T) { srv.restart(t) },
			ProcessKill:   fault.NATSAfterHandleBeforeAck,
		},
	})
}

// newConformanceInstance gives each test a stream of its own on the shared
// server, and creates a durable consumer per consumer before anything is
// published.
func newConformanceInstance(t *testing.T, srv *server, o brokertest.Options) brokertest.Instance {
	n := newNames()
	pub := newPublisher(t, srv.url(), n.stream)
	js, err := jetstream.New(pub.Conn())
	if err != nil {
		t.Fatal(err)
	}
	config := func(consumer string) nats.SubscriberConfig {
		return conformanceConfig(childSpec{URL: srv.url(), Stream: n.stream, Consumer: consumer})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range o.Consumers {
		if _, err := js.CreateOrUpdateConsumer(ctx, n.stream.Name, config(c).ConsumerConfig()); err != nil {
			t.Fatalf("create consumer %s: %v", c, err)
		}
	}
	return brokertest.Instance{
		Publisher: pub,
		NewSubscriber: func(t *testing.T, consumer string, deliver broker.DeliverFunc) broker.Subscriber {
			cfg := config(consumer)
			cfg.Logger = brokertest.LogTo(t)
			sub, err := nats.NewSubscriber(cfg, deliver)
			if err != nil {
				t.Fatal(err)
			}
			return sub
		},
		PublishRaw: func(t *testing.T, name string, body []byte, headers map[string]string) {
			subject, err := n.stream.Subject(name)
			if err != nil {
				t.Fatal(err)
			}
			msg := &natsgo.Msg{Subject: subject, Data: body, Header: natsgo.Header{}}
			for k, v := range headers {
				msg.Header.Set(k, v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				t.Fatal(err)
			}
		},
		Backlog: func(t *testing.T, consumer string) int {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := js.Consumer(ctx, n.stream.Name, consumer)
			if err != nil {
				t.Fatalf("consumer %s: %v", consumer, err)
			}
			info, err := c.Info(ctx)
			if err != nil {
				t.Fatalf("consumer %s: %v", consumer, err)
			}
			return int(info.NumPending) + info.NumAckPending
		},
		ChildSpec: func(consumer string) any { return childSpec{URL: srv.url(), Stream: n.stream, Consumer: consumer} },
	}
}

// childSpec is how the suite's subscribers subscribe, in the test process
// or in its child.
type childSpec struct {
	URL      string            `json:"url"`
	Stream   nats.StreamConfig `json:"stream"`
	Consumer string            `json:"consumer"`
}

func conformanceConfig(s childSpec) nats.SubscriberConfig {
	return nats.SubscriberConfig{
		ConnConfig: nats.ConnConfig{URL: s.URL, ReconnectWait: 50 * time.Millisecond},
		Stream:     s.Stream,
		Consumer:   s.Consumer,
		Workers:    1,
		AckWait:    conformanceAckWait,
	}
}

// newChildSubscriber is the subscriber of the suite's child process
// (brokertest.ChildMain), which hits fault.NATSAfterHandleBeforeAck itself.
func newChildSubscriber(spec json.RawMessage, deliver broker.DeliverFunc) (broker.Subscriber, error) {
	var s childSpec
	if err := json.Unmarshal(spec, &s); err != nil {
		return nil, err
	}
	return nats.NewSubscriber(conformanceConfig(s), deliver)
}
