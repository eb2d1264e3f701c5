package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/idem-go/idem/broker"
)

var _ broker.Inspector = (*Publisher)(nil)

// Inspect implements broker.Inspector: for each consumer, its consumer
// group (PublisherConfig.GroupOf) and the records it has still to handle,
// Lag: on every partition of the topics it committed offsets on or is
// assigned, the end offset minus its committed offset, or minus the start
// offset where it committed nothing (a subscriber starts there). Consumers
// is the group's members. Kafka does not tell what a member has fetched
// and not committed: Ready and Unacked are -1. A group the cluster does not
// know is left out.
func (p *Publisher) Inspect(ctx context.Context, consumers []string) ([]broker.QueueStats, error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	adm := kadm.NewClient(p.cl)
	var out []broker.QueueStats
	for _, c := range consumers {
		group := p.cfg.GroupOf(c)
		q, ok, err := groupLag(ctx, adm, group)
		if err != nil {
			return nil, fmt.Errorf("idem: kafka: inspect group %s: %w", group, err)
		}
		if ok {
			q.Consumer = c
			out = append(out, q)
		}
	}
	return out, nil
}

// groupLag returns the figures of group, and false when the cluster does not
// know it.
func groupLag(ctx context.Context, adm *kadm.Client, group string) (broker.QueueStats, bool, error) {
	described, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return broker.QueueStats{}, false, err
	}
	g := described[group]
	switch {
	case errors.Is(g.Err, kerr.GroupIDNotFound):
		return broker.QueueStats{}, false, nil
	case g.Err != nil:
		return broker.QueueStats{}, false, g.Err
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return broker.QueueStats{}, false, err
	}
	if g.State == "Dead" && len(committed) == 0 {
		return broker.QueueStats{}, false, nil
	}
	topics := described.AssignedPartitions()
	topics.Merge(committed.Partitions())
	q := broker.QueueStats{Queue: group, Ready: -1, Unacked: -1, Consumers: int64(len(g.Members))}
	if names := topics.Topics(); len(names) > 0 {
		starts, err := adm.ListStartOffsets(ctx, names...)
		if err != nil {
			return broker.QueueStats{}, false, err
		}
		ends, err := adm.ListEndOffsets(ctx, names...)
		if err != nil {
			return broker.QueueStats{}, false, err
		}
		if err := ends.Error(); err != nil {
			return broker.QueueStats{}, false, err
		}
		ends.Each(func(end kadm.ListedOffset) {
			from := int64(-1)
			if c, ok := committed.Lookup(end.Topic, end.Partition); ok && c.Err == nil && c.At >= 0 {
				from = c.At
			} else if s, ok := starts.Lookup(end.Topic, end.Partition); ok && s.Err == nil {
				from = s.Offset
			}
			if from >= 0 {
				q.Lag += max(end.Offset-from, 0)
			}
		})
	}
	return q, true, nil
}
