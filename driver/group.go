package driver

import (
	"context"
	"time"
)

// GroupLeases is the part of a Dialect that keeps the membership and
// partition leases of consumers' ownership groups (inbox.Group), in the
// tables of migration 0008 (Tables.ConsumerMember, Tables.ConsumerPartition).
// The conformance suite (drivertest.GroupLeases) checks it.
//
// Every lease is timed by the database's clock alone: a method that sets a
// lease sets it to the database's current time plus ttl, and a lease is
// live while that time is after the database's current time. The clocks of
// the replicas play no part, so that their skew cannot give one partition
// two owners. Each method is one or two statements on ex, which is meant to
// be the pool (each statement commits on its own).
type GroupLeases interface {
	// HeartbeatMember records that member of consumer is alive until the
	// database's time plus ttl, joining the group when it is not in it
	// (again, after its lease expired).
	HeartbeatMember(ctx context.Context, ex Executor, consumer, member string, ttl time.Duration) error
	// LiveMembers deletes the members of consumer whose lease has expired
	// and returns the others' ids, sorted (byte order), so that every
	// replica computes the same assignment from them.
	LiveMembers(ctx context.Context, ex Executor, consumer string) ([]string, error)
	// LeaveGroup deletes member from consumer's group, so that the others
	// need not wait for its lease to expire. Its partition leases are
	// released by ReleasePartition.
	LeaveGroup(ctx context.Context, ex Executor, consumer, member string) error
	// AcquirePartition makes member the owner of partition of consumer
	// until the database's time plus ttl, when the partition is free (never
	// taken, or released), its lease has expired, or it is already
	// member's. A new tenure (free or expired before, or another owner's)
	// increments the epoch; renewing a live lease of member's keeps it. It
	// reports whether member owns the partition now, with its lease.
	AcquirePartition(ctx context.Context, ex Executor, consumer, member string, partition int, ttl time.Duration) (PartitionLease, bool, error)
	// RenewPartitions extends to the database's time plus ttl the live
	// leases member holds on the partitions of held in consumer's group
	// (its other leases, if any, are left to expire), and returns those of
	// held that member does not hold any more (taken over, released,
	// expired): lost, in the order of held.
	RenewPartitions(ctx context.Context, ex Executor, consumer, member string, held []int, ttl time.Duration) (lost []int, err error)
	// ReleasePartition frees partition of consumer when member owns it
	// (live or expired), and reports whether it did. The epoch stays.
	ReleasePartition(ctx context.Context, ex Executor, consumer, member string, partition int) (bool, error)
	// ListGroups returns the members and partitions of consumer's group,
	// or of every consumer's when consumer is "", expired leases included
	// (see GroupStatus.Now), for "idem status" and the dashboard.
	ListGroups(ctx context.Context, ex Executor, consumer string) (GroupStatus, error)
}

// PartitionLease is a partition's lease as AcquirePartition set it.
type PartitionLease struct {
	// Partition is the partition number.
	Partition int
	// Epoch counts the partition's tenures: it increments each time the
	// partition changes hands (or is taken again after it was free or
	// expired).
	Epoch int64
	// Until is when the lease expires, by the database's clock.
	Until time.Time
}

// GroupStatus is what GroupLeases.ListGroups returns.
type GroupStatus struct {
	// Now is the database's clock when the rows were read: a lease is live
	// while its Until is after Now.
	Now time.Time
	// Members are sorted by consumer name, then member id.
	Members []GroupMember
	// Partitions are sorted by consumer name, then partition number.
	Partitions []PartitionOwner
}

// GroupMember is a member of a consumer's ownership group.
type GroupMember struct {
	// Consumer is the consumer's name.
	Consumer string
	// ID is the member's id (inbox.GroupConfig.MemberID).
	ID string
	// Until is when its lease expires, by the database's clock.
	Until time.Time
}

// PartitionOwner is a partition of a consumer's ownership group and its
// owner.
type PartitionOwner struct {
	// Consumer is the consumer's name.
	Consumer string
	// Partition is the partition number.
	Partition int
	// Owner is the owning member's id, "" when the partition is free.
	Owner string
	// Epoch counts its tenures (PartitionLease.Epoch).
	Epoch int64
	// Until is when the owner's lease expires (zero when free), by the
	// database's clock.
	Until time.Time
}

// Live reports whether p has an owner whose lease has not expired at now
// (GroupStatus.Now).
func (p PartitionOwner) Live(now time.Time) bool {
	return p.Owner != "" && p.Until.After(now)
}
