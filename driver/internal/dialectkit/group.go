package dialectkit

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/driver"
)

// GroupSQL are a dialect's statements of driver.GroupLeases, which Base
// implements. Each statement takes its arguments in the order given here
// (PostgreSQL numbers them, MySQL and SQLite take them in that order); ttl
// is passed as DurationArg makes it.
type GroupSQL struct {
	// Heartbeat upserts a member: consumer, member, ttl.
	Heartbeat string
	// DeleteExpiredMembers deletes consumer's expired members: consumer.
	DeleteExpiredMembers string
	// SelectLiveMembers selects the member_id of consumer's live members:
	// consumer.
	SelectLiveMembers string
	// DeleteMember deletes a member: consumer, member.
	DeleteMember string
	// Acquire inserts the partition, or updates it when it is free,
	// expired or member's (epoch incremented unless member's lease is
	// live): consumer, partition, member, ttl.
	Acquire string
	// SelectPartition selects a partition's owner (NULL when free), epoch,
	// lease_until and whether the lease is live (0 or 1): consumer,
	// partition.
	SelectPartition string
	// Renew extends member's live leases among the held partitions: ttl,
	// consumer, member, held (the partition numbers, comma-separated).
	Renew string
	// SelectOwned selects the partition_no of member's live leases:
	// consumer, member.
	SelectOwned string
	// Release frees a partition owned by member: consumer, partition,
	// member.
	Release string
	// Now selects the database's current time.
	Now string
	// ListMembers selects consumer_name, member_id, lease_until of the
	// members of one consumer, or all when it is "", sorted: consumer,
	// consumer.
	ListMembers string
	// ListPartitions selects consumer_name, partition_no, owner (NULL when
	// free), epoch, lease_until (NULL when free) of the partitions of one
	// consumer, or all when it is "", sorted: consumer, consumer.
	ListPartitions string
	// DurationArg turns a ttl into the statements' argument.
	DurationArg func(time.Duration) any
	// TimeDest adapts a timestamp column, which may be NULL, to the
	// dialect's representation (NullTime, sqltime.Scanner).
	TimeDest func(*time.Time) any
}

// HeartbeatMember implements driver.GroupLeases.
func (b *Base) HeartbeatMember(ctx context.Context, ex driver.Executor, consumer, member string, ttl time.Duration) error {
	g := &b.spec.Groups
	_, err := ex.Exec(ctx, g.Heartbeat, consumer, member, g.DurationArg(ttl))
	return b.Wrap(err)
}

// LiveMembers implements driver.GroupLeases.
func (b *Base) LiveMembers(ctx context.Context, ex driver.Executor, consumer string) ([]string, error) {
	g := &b.spec.Groups
	if _, err := ex.Exec(ctx, g.DeleteExpiredMembers, consumer); err != nil {
		return nil, b.Wrap(err)
	}
	var out []string
	err := driver.QueryRows(ctx, ex, g.SelectLiveMembers, []any{consumer}, func(rows driver.Rows) error {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		out = append(out, id)
		return nil
	})
	if err != nil {
		return nil, b.Wrap(err)
	}
	slices.Sort(out) // byte order, whatever the column's collation
	return out, nil
}

// LeaveGroup implements driver.GroupLeases.
func (b *Base) LeaveGroup(ctx context.Context, ex driver.Executor, consumer, member string) error {
	g := &b.spec.Groups
	_, err := ex.Exec(ctx, g.DeleteMember, consumer, member)
	return b.Wrap(err)
}

// AcquirePartition implements driver.GroupLeases: the conditional upsert,
// then a read of the row, which tells whether member owns it (the upsert's
// row count does not: MySQL counts unchanged rows as 0).
func (b *Base) AcquirePartition(ctx context.Context, ex driver.Executor, consumer, member string, partition int, ttl time.Duration) (driver.PartitionLease, bool, error) {
	g := &b.spec.Groups
	if _, err := ex.Exec(ctx, g.Acquire, consumer, partition, member, g.DurationArg(ttl)); err != nil {
		return driver.PartitionLease{}, false, b.Wrap(err)
	}
	var (
		owner *string
		live  bool
	)
	l := driver.PartitionLease{Partition: partition}
	err := driver.QueryRow(ctx, ex, g.SelectPartition, []any{consumer, partition}, &owner, &l.Epoch, g.TimeDest(&l.Until), &live)
	if err != nil {
		return driver.PartitionLease{}, false, b.Wrap(err)
	}
	if owner == nil || *owner != member || !live {
		return driver.PartitionLease{}, false, nil
	}
	return l, true, nil
}

// RenewPartitions implements driver.GroupLeases.
func (b *Base) RenewPartitions(ctx context.Context, ex driver.Executor, consumer, member string, held []int, ttl time.Duration) ([]int, error) {
	g := &b.spec.Groups
	nums := make([]string, len(held))
	for i, p := range held {
		nums[i] = strconv.Itoa(p)
	}
	if _, err := ex.Exec(ctx, g.Renew, g.DurationArg(ttl), consumer, member, strings.Join(nums, ",")); err != nil {
		return nil, b.Wrap(err)
	}
	owned := map[int]bool{}
	err := driver.QueryRows(ctx, ex, g.SelectOwned, []any{consumer, member}, func(rows driver.Rows) error {
		var p int
		if err := rows.Scan(&p); err != nil {
			return err
		}
		owned[p] = true
		return nil
	})
	if err != nil {
		return nil, b.Wrap(err)
	}
	var lost []int
	for _, p := range held {
		if !owned[p] {
			lost = append(lost, p)
		}
	}
	return lost, nil
}

// ReleasePartition implements driver.GroupLeases.
func (b *Base) ReleasePartition(ctx context.Context, ex driver.Executor, consumer, member string, partition int) (bool, error) {
	g := &b.spec.Groups
	n, err := ex.Exec(ctx, g.Release, consumer, partition, member)
	return n == 1, b.Wrap(err)
}

// ListGroups implements driver.GroupLeases.
func (b *Base) ListGroups(ctx context.Context, ex driver.Executor, consumer string) (driver.GroupStatus, error) {
	g := &b.spec.Groups
	var s driver.GroupStatus
	if err := driver.QueryRow(ctx, ex, g.Now, nil, g.TimeDest(&s.Now)); err != nil {
		return driver.GroupStatus{}, b.Wrap(err)
	}
	err := driver.QueryRows(ctx, ex, g.ListMembers, []any{consumer, consumer}, func(rows driver.Rows) error {
		var m driver.GroupMember
		if err := rows.Scan(&m.Consumer, &m.ID, g.TimeDest(&m.Until)); err != nil {
			return err
		}
		s.Members = append(s.Members, m)
		return nil
	})
	if err != nil {
		return driver.GroupStatus{}, b.Wrap(err)
	}
	err = driver.QueryRows(ctx, ex, g.ListPartitions, []any{consumer, consumer}, func(rows driver.Rows) error {
		var (
			p     driver.PartitionOwner
			owner *string
		)
		if err := rows.Scan(&p.Consumer, &p.Partition, &owner, &p.Epoch, g.TimeDest(&p.Until)); err != nil {
			return err
		}
		if owner != nil {
			p.Owner = *owner
		}
		s.Partitions = append(s.Partitions, p)
		return nil
	})
	if err != nil {
		return driver.GroupStatus{}, b.Wrap(err)
	}
	return s, nil
}
