package amqp

import (
	"context"
	"errors"
	"fmt"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/broker"
)

// Inspect implements broker.Inspector: for each consumer, its queue
// (PublisherConfig.QueueOf) declared passively, which tells the messages
// ready for delivery and the consumers attached without changing the
// queue. AMQP does not tell the messages delivered and not yet
// acknowledged: Unacked is -1 (RabbitMQ's management API has them). A
// queue that does not exist is left out. A partitioned consumer
// (SubscriberConfig.Partitions) has one QueueStats per partition queue,
// "<queue>.p0" and on, after its unpartitioned queue's if that exists.
func (p *Publisher) Inspect(ctx context.Context, consumers []string) ([]broker.QueueStats, error) {
	conn, err := p.connection(ctx)
	if err != nil {
		return nil, err
	}
	var (
		out []broker.QueueStats
		ch  *amqp091.Channel
	)
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for _, c := range consumers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		base := p.cfg.QueueOf(c)
		// The queue, then its partition queues until one is missing.
		for k := -1; k < PartitionsMax; k++ {
			name := base
			if k >= 0 {
				name = PartitionQueue(base, k)
			}
			if ch == nil {
				if ch, err = conn.Channel(); err != nil {
					return nil, fmt.Errorf("idem: amqp: inspect: open channel on %s: %w", p.cfg.redacted(), err)
				}
			}
			q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			if err != nil {
				// The server closes the channel: the next queue gets another.
				ch = nil
				var ae *amqp091.Error
				if errors.As(err, &ae) && ae.Code == amqp091.NotFound {
					if k < 0 {
						continue
					}
					break
				}
				return nil, fmt.Errorf("idem: amqp: inspect queue %s: %w", name, err)
			}
			out = append(out, broker.QueueStats{Consumer: c, Queue: name,
				Ready: int64(q.Messages), Unacked: -1, Lag: -1, Consumers: int64(q.Consumers)})
		}
	}
	return out, nil
}

// connection returns the publisher's connection, connecting first if
// needed.
func (p *Publisher) connection(ctx context.Context) (*amqp091.Connection, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if p.conn == nil || p.conn.IsClosed() {
		if err := p.connectLocked(ctx); err != nil {
			return nil, err
		}
	}
	return p.conn, nil
}
