package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/redact"
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
	// Partition is the partition to consume when the URL gives the queue
	// or stream partitions (see Partitions) and no partition parameter of
	// its own: what an inbox.Group's subscriber factory sets.
	Partition int
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
// messages of cfg.EventNames from the broker at rawURL.
func Subscribe(rawURL string, cfg SubscribeConfig, deliver broker.DeliverFunc) (broker.Subscriber, error) {
	if cfg.Consumer == "" || len(cfg.EventNames) == 0 {
		return nil, errors.New("registry: Subscribe needs a consumer name and event names")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t, err := brokerSchemeOf(rawURL)
	if err != nil {
		return nil, err
	}
	if t.subscribe == nil {
		return nil, fmt.Errorf("broker URL %s: this transport publishes only; subscribe with amqp://, kafka:// or nats://", broker.RedactURL(rawURL))
	}
	names := slices.DeleteFunc(slices.Clone(cfg.EventNames), func(n string) bool { return n == inbox.AnyEvent })
	slices.Sort(names)
	sub, err := t.subscribe(rawURL, cfg, names, deliver)
	return sub, redact.Error(err)
}

// Partitions returns the number of partitions rawURL gives each consumer's
// queue (RabbitMQ) or the stream (NATS): its parameter partitions, 0 when
// absent. Consumers of a partitioned URL run their partitions' subscribers
// in an inbox.Group. Kafka partitions topics by itself: 0.
func Partitions(rawURL string) (int, error) {
	t, err := brokerSchemeOf(rawURL)
	if err != nil || t.partitions == nil {
		return 0, err
	}
	n, err := t.partitions(rawURL)
	return n, redact.Error(err)
}

// withAckFault hits the fault point fault.InboxAfterCommitBeforeAck after
// deliver returns, before the transport acknowledges (or commits) what it
// handled, as the RabbitMQ subscriber does itself: a process killed there
// has its messages delivered again. The Kafka and NATS subscribers of the
// registry wrap their DeliverFunc with it. Without fault points, it is
// deliver.
func withAckFault(deliver broker.DeliverFunc) broker.DeliverFunc {
	if !fault.Enabled {
		return deliver
	}
	return func(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		disps, errs := deliver(ctx, ds)
		fault.Point(fault.InboxAfterCommitBeforeAck)
		return disps, errs
	}
}
