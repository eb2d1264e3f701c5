package monitor

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// PartitionStatus is a partition of a consumer's ownership group
// (inbox.Group) and its owner.
type PartitionStatus struct {
	// Consumer is the consumer's name.
	Consumer string
	// Partition is the partition number.
	Partition int
	// Owner is the member (replica) holding its lease; "" when free.
	Owner string
	// Epoch counts the partition's tenures: it increments each time the
	// partition changes hands.
	Epoch int64
	// LeaseLeft is how long the owner's lease runs after Snapshot.Taken;
	// zero or negative when it has expired (the owner stopped renewing it)
	// or the partition is free.
	LeaseLeft time.Duration
	// Queue is the broker's figures of the partition's queue or durable
	// consumer, when the broker was given and reports it (QueueStats.Queue
	// ending in ".p<n>" or "-p<n>"); nil otherwise.
	Queue *broker.QueueStats
}

// Live reports whether the partition has an owner whose lease runs.
func (p PartitionStatus) Live() bool { return p.Owner != "" && p.LeaseLeft > 0 }

// readPartitions reads the ownership groups of every consumer, when the
// database has their tables (migration 0008): nil otherwise, as for a
// database where no group ever ran.
func readPartitions(ctx context.Context, db Database, queues []broker.QueueStats) ([]PartitionStatus, error) {
	st, err := db.Dialect().ListGroups(ctx, db.Pool(), "")
	if errors.Is(err, idem.ErrMissingTable) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]PartitionStatus, 0, len(st.Partitions))
	for _, p := range st.Partitions {
		ps := PartitionStatus{Consumer: p.Consumer, Partition: p.Partition, Owner: p.Owner, Epoch: p.Epoch}
		if p.Owner != "" {
			ps.LeaseLeft = p.Until.Sub(st.Now)
		}
		for i, q := range queues {
			if n, ok := QueuePartition(q.Queue); ok && q.Consumer == p.Consumer && n == p.Partition {
				ps.Queue = &queues[i]
				break
			}
		}
		out = append(out, ps)
	}
	return out, nil
}

var partitionSuffix = regexp.MustCompile(`[.-]p([0-9]+)$`)

// QueuePartition returns the partition a broker queue or durable consumer
// name is of: the number n of its ".p<n>" (RabbitMQ's partition queues) or
// "-p<n>" (NATS JetStream's partition durables) suffix.
func QueuePartition(queue string) (int, bool) {
	m := partitionSuffix.FindStringSubmatch(queue)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}
