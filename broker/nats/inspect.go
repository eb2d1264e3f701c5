package nats

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/broker"
)

var _ broker.Inspector = (*Publisher)(nil)

// Inspect implements broker.Inspector: for each consumer, the durable
// consumer of that name on the publisher's stream (as Subscriber creates
// it): Ready is its NumPending (messages not yet delivered), Unacked its
// NumAckPending (delivered, retries held in progress included), Consumers
// the pull requests waiting. A durable consumer that does not exist is
// left out.
func (p *Publisher) Inspect(ctx context.Context, consumers []string) ([]broker.QueueStats, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, ErrClosed
	}
	var out []broker.QueueStats
	for _, c := range consumers {
		cons, err := p.js.Consumer(ctx, p.cfg.Stream.Name, c)
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrInvalidConsumerName) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("idem: nats: inspect consumer %s of stream %s: %w", c, p.cfg.Stream.Name, err)
		}
		info := cons.CachedInfo() // just fetched by Consumer
		out = append(out, broker.QueueStats{Consumer: c, Queue: p.cfg.Stream.Name + "/" + c,
			Ready: int64(info.NumPending), Unacked: int64(info.NumAckPending), Lag: -1, Consumers: int64(info.NumWaiting)})
	}
	return out, nil
}
