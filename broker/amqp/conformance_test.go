package amqp_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/testamqp"
)

func TestConformance(t *testing.T) {
	brokertest.Run(t, brokertest.Transport{
		New: newConformanceInstance,
		Features: brokertest.Features{
			PerKeyOrder: true,
			Redeliver:   true,
			Inspect:     true,
			Restart:     func(t *testing.T) { testamqp.Restart(t) },
			Exclusive:   func(t *testing.T) { testamqp.Exclusive(t) },
			ProcessKill: fault.InboxAfterCommitBeforeAck,
		},
	})
}

// newConformanceInstance gives each test an exchange of its own, and one
// queue per consumer, declared before anything is published.
func newConformanceInstance(t *testing.T, o brokertest.Options) brokertest.Instance {
	url := testamqp.URL(t)
	exchange := testamqp.Name("idem_t_")
	queue := func(consumer string) string { return exchange + "." + consumer }
	var queues []string
	for _, c := range o.Consumers {
		queues = append(queues, queue(c))
	}
	declare(t, url, exchange, queues, o.EventNames)
	return brokertest.Instance{
		Publisher: newInspectingPublisher(t, url, exchange, queue),
		NewSubscriber: func(t *testing.T, consumer string, deliver broker.DeliverFunc) broker.Subscriber {
			return newSubscriber(t, subscriberConfig(url, exchange, queue(consumer), o.EventNames...), deliver)
		},
		PublishRaw: func(t *testing.T, name string, body []byte, headers map[string]string) {
			table := amqp091.Table{}
			for k, v := range headers {
				table[k] = v
			}
			withChannel(t, url, func(ch *amqp091.Channel) {
				if err := ch.Confirm(false); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, name, true, false,
					amqp091.Publishing{Body: body, DeliveryMode: amqp091.Persistent, Headers: table})
				if err != nil {
					t.Fatal(err)
				}
				if ok, err := dc.WaitContext(ctx); !ok || err != nil {
					t.Fatalf("raw publish not confirmed: %v", err)
				}
			})
		},
		Backlog: func(t *testing.T, consumer string) int { return queueDepth(t, url, queue(consumer)) },
		ChildSpec: func(consumer string) any {
			return childSpec{URL: url, Exchange: exchange, Queue: queue(consumer), Bindings: o.EventNames}
		},
	}
}

// childSpec is how the suite's child process subscribes.
type childSpec struct {
	URL      string   `json:"url"`
	Exchange string   `json:"exchange"`
	Queue    string   `json:"queue"`
	Bindings []string `json:"bindings"`
}

// newChildSubscriber is the subscriber of the suite's child process
// (brokertest.ChildMain), which hits fault.InboxAfterCommitBeforeAck itself.
func newChildSubscriber(spec json.RawMessage, deliver broker.DeliverFunc) (broker.Subscriber, error) {
	var s childSpec
	if err := json.Unmarshal(spec, &s); err != nil {
		return nil, err
	}
	return amqp.NewSubscriber(subscriberConfig(s.URL, s.Exchange, s.Queue, s.Bindings...), deliver)
}

// newInspectingPublisher is newPublisher whose Inspect finds each
// consumer's queue with queueOf.
func newInspectingPublisher(t *testing.T, url, exchange string, queueOf func(string) string) *amqp.Publisher {
	t.Helper()
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange, QueueOf: queueOf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}
