package amqp_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
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
			// Through the default exchange to the consumer's queue.
			ConsumerPublisher: true,
			Inspect:           true,
			Restart:           func(t *testing.T) { testamqp.Restart(t) },
			Exclusive:         func(t *testing.T) { testamqp.Exclusive(t) },
			ProcessKill:       fault.InboxAfterCommitBeforeAck,
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
			cfg := subscriberConfig(url, exchange, queue(consumer), o.EventNames...)
			cfg.Logger = brokertest.LogTo(t)
			return newSubscriber(t, cfg, deliver)
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

// childSpec is how a child process (brokertest.ChildMain) subscribes.
type childSpec struct {
	URL      string   `json:"url"`
	Exchange string   `json:"exchange"`
	Queue    string   `json:"queue"`
	Bindings []string `json:"bindings"`
	// The replica tests' settings: with Partitions, the child runs one
	// subscriber for each of PartitionList; Log logs the subscribers'
	// activity (standing by, active) on stderr.
	Partitions    int            `json:"partitions,omitempty"`
	PartitionList []int          `json:"partition_list,omitempty"`
	StandbyPoll   time.Duration  `json:"standby_poll,omitempty"`
	Workers       int            `json:"workers,omitempty"`
	QueueType     amqp.QueueType `json:"queue_type,omitempty"`
	BatchSize     int            `json:"batch_size,omitempty"`
	Log           bool           `json:"log,omitempty"`
}

// newChildSubscriber is the subscriber of a child process
// (brokertest.ChildMain): the suite's, which hits
// fault.InboxAfterCommitBeforeAck itself, or a replica test's.
func newChildSubscriber(spec json.RawMessage, deliver broker.DeliverFunc) (broker.Subscriber, error) {
	var s childSpec
	if err := json.Unmarshal(spec, &s); err != nil {
		return nil, err
	}
	cfg := subscriberConfig(s.URL, s.Exchange, s.Queue, s.Bindings...)
	cfg.StandbyPoll, cfg.BatchSize = s.StandbyPoll, s.BatchSize
	if s.Workers > 0 {
		cfg.Workers = s.Workers
	}
	cfg.QueueType = s.QueueType
	if s.Log {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if s.Partitions == 0 {
		return amqp.NewSubscriber(cfg, deliver)
	}
	var subs multiSubscriber
	for _, k := range s.PartitionList {
		cfg.Partitions, cfg.Partition = s.Partitions, k
		sub, err := amqp.NewSubscriber(cfg, deliver)
		if err != nil {
			return nil, err
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// multiSubscriber runs several subscribers as one.
type multiSubscriber []*amqp.Subscriber

func (m multiSubscriber) Start(ctx context.Context) error {
	for i, s := range m {
		if err := s.Start(ctx); err != nil {
			_ = m[:i].Stop(context.Background())
			return err
		}
	}
	return nil
}

func (m multiSubscriber) Stop(ctx context.Context) error {
	var errs []error
	for _, s := range m {
		errs = append(errs, s.Stop(ctx))
	}
	return errors.Join(errs...)
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
