package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/idem-go/idem/broker"
)

var _ broker.Rewinder = (*Publisher)(nil)

// Rewind implements broker.Rewinder: it commits, for consumer's group
// (PublisherConfig.GroupOf), on each partition where the group has
// committed an offset, the offset of the first record whose timestamp (the
// time the relay produced it) is at or after to, where that is before the
// committed one. The group then reads those records again when its
// subscribers start, and skips the events it applied, as duplicates.
// Kafka takes a group's offsets from outside only while the group has no
// member: Rewind refuses a group with members, saying so. A group without
// committed offsets has nothing to rewind (a new subscriber starts at the
// beginning of its topics).
func (p *Publisher) Rewind(ctx context.Context, consumer string, to time.Time) (int, error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	adm := kadm.NewClient(p.cl)
	group := p.cfg.GroupOf(consumer)
	described, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return 0, fmt.Errorf("idem: kafka: rewind group %s: %w", group, err)
	}
	g := described[group]
	switch {
	case errors.Is(g.Err, kerr.GroupIDNotFound):
		return 0, fmt.Errorf("idem: kafka: rewind: no consumer group %s (consumer %s)", group, consumer)
	case g.Err != nil:
		return 0, fmt.Errorf("idem: kafka: rewind group %s: %w", group, g.Err)
	case len(g.Members) > 0:
		return 0, fmt.Errorf("idem: kafka: rewind group %s: it has %d member(s): stop consumer %s's subscribers first (Kafka takes a group's offsets from outside only while it has none)",
			group, len(g.Members), consumer)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("idem: kafka: rewind group %s: fetch its offsets: %w", group, err)
	}
	topics := committed.Partitions().Topics()
	if len(topics) == 0 {
		return 0, nil
	}
	listed, err := adm.ListOffsetsAfterMilli(ctx, to.UnixMilli(), topics...)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("idem: kafka: rewind group %s: list the offsets at %s: %w", group, to.UTC().Format(time.RFC3339), err)
	}
	var back kadm.Offsets
	n := 0
	listed.Each(func(l kadm.ListedOffset) {
		c, ok := committed.Lookup(l.Topic, l.Partition)
		if !ok || c.Err != nil || l.Offset < 0 || l.Offset >= c.At {
			return
		}
		back.Add(kadm.Offset{Topic: l.Topic, Partition: l.Partition, At: l.Offset, LeaderEpoch: -1})
		n++
	})
	if n == 0 {
		return 0, nil
	}
	resp, err := adm.CommitOffsets(ctx, group, back)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("idem: kafka: rewind group %s: commit its offsets: %w", group, err)
	}
	return n, nil
}
