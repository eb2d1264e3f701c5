package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/broker"
)

var _ broker.Inspector = (*Publisher)(nil)

// Inspect implements broker.Inspector: for each consumer, the durable
// consumer of that name on the publisher's stream (as Subscriber creates
// it) or, when the stream is partitioned (its metadata idem_partitions),
// the durable consumer of each partition (<consumer>-p<k>, Queue
// <stream>/<consumer>-p<k>): Ready is its NumPending (messages not yet
// delivered), Unacked its NumAckPending (delivered, retries held in
// progress included), Consumers the pull requests waiting. A durable
// consumer that does not exist is left out.
func (p *Publisher) Inspect(ctx context.Context, consumers []string) ([]broker.QueueStats, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, ErrClosed
	}
	partitions := 0
	stream, err := p.js.Stream(ctx, p.cfg.Stream.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("idem: nats: inspect stream %s: %w", p.cfg.Stream.Name, err)
	default:
		if partitions, err = streamPartitions(stream.CachedInfo().Config); err != nil {
			return nil, err
		}
	}
	var out []broker.QueueStats
	for _, c := range consumers {
		durables := []string{c}
		if partitions > 0 {
			durables = durables[:0]
			for k := range partitions {
				durables = append(durables, c+"-p"+strconv.Itoa(k))
			}
		}
		for _, d := range durables {
			cons, err := p.js.Consumer(ctx, p.cfg.Stream.Name, d)
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrInvalidConsumerName) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("idem: nats: inspect consumer %s of stream %s: %w", d, p.cfg.Stream.Name, err)
			}
			info := cons.CachedInfo() // just fetched by Consumer
			out = append(out, broker.QueueStats{Consumer: c, Queue: p.cfg.Stream.Name + "/" + d,
				Ready: int64(info.NumPending), Unacked: int64(info.NumAckPending), Lag: -1, Consumers: int64(info.NumWaiting)})
		}
	}
	return out, nil
}
