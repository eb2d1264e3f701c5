package registry

import (
	"cmp"
	"context"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
)

// amqpURLHelp describes the transport's URLs (BrokerURLHelp).
const amqpURLHelp = `amqp://user:pass@host:5672/ or amqps://...?cacertfile=ca.pem&certfile=c.pem&keyfile=k.pem (?queue_type=quorum, ?exchange=, ?partitions=8&partition=3); a cluster: amqp://user:pass@h1:5672,h2:5672,h3:5672/`

// amqpConn returns the connection settings of the URL's configuration,
// named name.
func amqpConn(uc amqp.URLConfig, name string) amqp.ConnConfig {
	cc := uc.ConnConfig
	cc.ConnectionName = name
	return cc
}

// publishAMQP opens a RabbitMQ publisher. The query parameter "exchange"
// names the exchange (default "events", or "<prefix>.events").
func publishAMQP(ctx context.Context, rawURL, prefix string) (Publisher, error) {
	uc, err := amqp.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	named, _ := SubscribeConfig{Prefix: prefix}.Names()
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqpConn(uc, "idem"), Exchange: cmp.Or(uc.Exchange, named), QueueOf: amqpQueueOf(prefix),
		CloudEvents: uc.CloudEvents})
	if err != nil {
		return nil, err
	}
	if err := p.Connect(ctx); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// amqpQueueOf returns the function that names a consumer's queue, as
// SubscribeConfig.Names does.
func amqpQueueOf(prefix string) func(string) string {
	return func(consumer string) string {
		_, q := SubscribeConfig{Consumer: consumer, Prefix: prefix}.Names()
		return q
	}
}

// inspectAMQP opens a RabbitMQ publisher that declares nothing, for its
// Inspect.
func inspectAMQP(ctx context.Context, rawURL, prefix string) (Inspector, error) {
	uc, err := amqp.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqpConn(uc, "idem status"), NoDeclare: true, QueueOf: amqpQueueOf(prefix)})
	if err != nil {
		return nil, err
	}
	if err := p.Connect(ctx); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// partitionsAMQP reads the parameter partitions of a RabbitMQ URL.
func partitionsAMQP(rawURL string) (int, error) {
	uc, err := amqp.ParseURL(rawURL)
	return uc.Partitions, err
}

// subscribeAMQP returns a subscriber of the queue <consumer>.events bound
// to names; queue_type=quorum declares a quorum queue (a queue keeps the
// type it was declared with); partitions=P&partition=k consumes partition
// k of P (the queue <consumer>.events.p<k>).
func subscribeAMQP(rawURL string, cfg SubscribeConfig, names []string, deliver broker.DeliverFunc) (broker.Subscriber, error) {
	uc, err := amqp.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	exchange, queue := cfg.Names()
	sc := uc.SubscriberConfig()
	sc.ConnConfig = amqpConn(uc, cfg.Consumer)
	sc.Logger = cfg.Logger
	sc.Exchange = cmp.Or(uc.Exchange, exchange)
	sc.Queue, sc.Bindings = queue, names
	sc.Workers, sc.BatchSize = cfg.Workers, cfg.BatchSize
	if !uc.PartitionSet {
		sc.Partition = cfg.Partition
	}
	return amqp.NewSubscriber(sc, deliver)
}
