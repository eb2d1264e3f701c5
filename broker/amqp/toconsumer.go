package amqp

import (
	"context"
	"errors"
	"fmt"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// PublishToConsumer implements broker.ConsumerPublisher: it publishes msgs
// to the queue of consumer (PublisherConfig.QueueOf) only, through the
// default exchange, as Redeliver does, and not to the topic exchange,
// where every service bound to the events would receive them. A
// partitioned consumer (SubscriberConfig.Partitions), which has no queue of
// that name, gets them through its partition exchange
// ("<queue>.part<P>"), which sends each to the partition queue of its
// bucket, where the other messages of its aggregate are. A consumer
// without a queue is an error that wraps broker.ErrUnroutable. The queue
// receives every message given, also those its bindings would not select.
func (p *Publisher) PublishToConsumer(ctx context.Context, consumer string, msgs []idem.Message) error {
	queue := p.cfg.QueueOf(consumer)
	exchange, key, err := p.consumerRoute(ctx, queue)
	if err != nil {
		return err
	}
	targets := make([]target, len(msgs))
	for i, m := range msgs {
		targets[i] = target{exchange: exchange, key: key, msg: withoutAttempt(m)}
	}
	return p.publish(ctx, targets)
}

// consumerRoute returns the exchange and routing key that reach queue: the
// default exchange and the queue's name when it exists, else the partition
// exchange of its partition queues.
func (p *Publisher) consumerRoute(ctx context.Context, queue string) (exchange, key string, err error) {
	conn, err := p.connection(ctx)
	if err != nil {
		return "", "", err
	}
	// A passive declare of something missing closes its channel: one
	// channel per declare.
	exists := func(declare func(*amqp091.Channel) error) (bool, error) {
		ch, err := conn.Channel()
		if err != nil {
			return false, fmt.Errorf("idem: amqp: open channel on %s: %w", p.cfg.redacted(), err)
		}
		defer func() { _ = ch.Close() }()
		err = declare(ch)
		var ae *amqp091.Error
		if errors.As(err, &ae) && ae.Code == amqp091.NotFound {
			return false, nil
		}
		return err == nil, err
	}
	queueExists := func(name string) (bool, error) {
		return exists(func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			return err
		})
	}
	ok, err := queueExists(queue)
	if err != nil || ok {
		return "", queue, err
	}
	n := 0
	for ; n < PartitionsMax; n++ {
		ok, err := queueExists(PartitionQueue(queue, n))
		if err != nil {
			return "", "", err
		}
		if !ok {
			break
		}
	}
	if n == 0 {
		return "", "", fmt.Errorf("idem: amqp: no queue %q, nor partition queues %q: %w", queue, PartitionQueue(queue, 0), broker.ErrUnroutable)
	}
	part := PartitionExchange(queue, n)
	ok, err = exists(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclarePassive(part, amqp091.ExchangeHeaders, true, false, false, false, nil)
	})
	if err != nil {
		return "", "", err
	}
	if !ok {
		return "", "", fmt.Errorf("idem: amqp: %d partition queues %q... but no partition exchange %q: queues of an earlier partition count are left (see the package documentation, \"Partitions\"): %w",
			n, PartitionQueue(queue, 0), part, broker.ErrUnroutable)
	}
	return part, queue, nil
}

// withoutAttempt returns m without the attempt header, so that its
// consumer gives it a full set of attempts.
func withoutAttempt(m idem.Message) idem.Message {
	if _, ok := m.Headers[idem.HeaderAttempt]; !ok {
		return m
	}
	h := make(map[string]string, len(m.Headers))
	for k, v := range m.Headers {
		if k != idem.HeaderAttempt {
			h[k] = v
		}
	}
	m.Headers = h
	return m
}
