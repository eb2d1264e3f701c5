package brokeropen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/fault"
)

// Subscriber is a running subscription (broker.Subscriber).
type Subscriber = broker.Subscriber

// SubscribeConfig says what one consumer subscribes to.
type SubscribeConfig struct {
	// Consumer is the consumer name. It names the consumer's queue
	// (RabbitMQ: <consumer>.events), consumer group (Kafka) or durable
	// (NATS). Required.
	Consumer string
	// EventNames are the event names the consumer handles. Required.
	EventNames []string
	// Prefix, when set, is put before the exchange and queue names
	// (<prefix>.events, <prefix>.<consumer>.events) so that several
	// applications can share one broker.
	Prefix string
	// AggregateTypes are the aggregate types of EventNames, whose topics
	// (outbox.event.<aggregate type>) a Kafka consumer reads. Defaults to
	// the second part of each event name (<service>.<aggregate>.<event>.vN).
	AggregateTypes []string
	// Workers and BatchSize tune the transport (zero: its defaults).
	Workers, BatchSize int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Names returns the exchange and queue names of cfg on RabbitMQ.
func (cfg SubscribeConfig) Names() (exchange, queue string) {
	exchange, queue = amqp.ExchangeDefault, cfg.Consumer+".events"
	if cfg.Prefix != "" {
		exchange, queue = cfg.Prefix+"."+exchange, cfg.Prefix+"."+queue
	}
	return exchange, queue
}

// Subscribe returns a subscriber, not started, that feeds deliver with the
// messages of cfg.EventNames from the broker at rawURL. On RabbitMQ, the
// query parameter queue_type=quorum declares quorum queues instead of
// classic ones (a queue keeps the type it was declared with).
func Subscribe(rawURL string, cfg SubscribeConfig, deliver broker.DeliverFunc) (Subscriber, error) {
	if cfg.Consumer == "" || len(cfg.EventNames) == 0 {
		return nil, errors.New("brokeropen: Subscribe needs a consumer name and event names")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	names := slices.DeleteFunc(slices.Clone(cfg.EventNames), func(n string) bool { return n == inbox.AnyEvent })
	slices.Sort(names)
	if isKafkaURL(rawURL) {
		return subscribeKafka(rawURL, cfg, names, withAckFault(deliver))
	}
	rawURL = natsURL(rawURL)
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("broker URL %s: %w", broker.RedactURL(rawURL), err)
	}
	switch strings.ToLower(u.Scheme) {
	case "amqp", "amqps":
		exchange, queue := cfg.Names()
		connURL, _, queueType := amqpParams(u)
		if queueType != "" && queueType != amqp.Classic && queueType != amqp.Quorum {
			return nil, fmt.Errorf("broker URL %s: queue_type=%q: want %q or %q", broker.RedactURL(rawURL), queueType, amqp.Classic, amqp.Quorum)
		}
		return amqp.NewSubscriber(amqp.SubscriberConfig{
			ConnConfig: amqp.ConnConfig{URL: connURL, ConnectionName: cfg.Consumer, Logger: cfg.Logger},
			Exchange:   exchange, Queue: queue, Bindings: names, QueueType: queueType,
			Workers: cfg.Workers, BatchSize: cfg.BatchSize,
		}, deliver)
	case "nats":
		return subscribeNATS(u, cfg, names, withAckFault(deliver))
	default:
		return nil, fmt.Errorf("broker URL %s: scheme %q is not supported for subscribing: want amqp://, kafka:// or nats://", broker.RedactURL(rawURL), u.Scheme)
	}
}

// withAckFault hits the fault point amqp.FaultAfterCommitBeforeAck after
// deliver returns, before the transport acknowledges (or commits) what it
// handled, as the RabbitMQ subscriber does itself: a process killed there
// has its messages delivered again.
func withAckFault(deliver broker.DeliverFunc) broker.DeliverFunc {
	return func(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		disps, errs := deliver(ctx, ds)
		fault.Point(amqp.FaultAfterCommitBeforeAck)
		return disps, errs
	}
}

// OpenPrefixed is Open with the names of SubscribeConfig.Prefix when prefix
// is set: exchange <prefix>.events (RabbitMQ), topics
// <prefix>.outbox.event.<aggregate type> (Kafka), stream <PREFIX>_EVENTS and
// subjects <prefix>.events.<event name> (NATS).
func OpenPrefixed(ctx context.Context, rawURL, prefix string) (Publisher, error) {
	if isKafkaURL(rawURL) {
		return openKafkaPrefixed(ctx, rawURL, prefix)
	}
	rawURL = natsURL(rawURL)
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("broker URL %s: %w", broker.RedactURL(rawURL), err)
	}
	switch strings.ToLower(u.Scheme) {
	case "amqp", "amqps":
		exchange, _ := SubscribeConfig{Prefix: prefix}.Names()
		connURL, _, _ := amqpParams(u)
		p, err := amqp.NewPublisher(amqp.PublisherConfig{
			ConnConfig: amqp.ConnConfig{URL: connURL, ConnectionName: "relay"},
			Exchange:   exchange,
		})
		if err != nil {
			return nil, err
		}
		if err := p.Connect(ctx); err != nil {
			_ = p.Close()
			return nil, err
		}
		return p, nil
	case "nats":
		return openNATS(ctx, u, prefix)
	}
	return Open(ctx, rawURL)
}
