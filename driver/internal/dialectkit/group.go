package dialectkit

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/driver"
)

// GroupSQL implements driver.GroupLeases for a dialect, given its
// statements. Each statement takes its arguments in the order given here
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
	// Wrap translates errors (the missing-table hint).
	Wrap func(error) error
}

func (g *GroupSQL) timeDest(t *time.Time) any { return g.TimeDest(t) }

// HeartbeatMember implements driver.GroupLeases.
func (g *GroupSQL) HeartbeatMember(ctx context.Context, ex driver.Executor, consumer, member string, ttl time.Duration) error {
	_, err := ex.Exec(ctx, g.Heartbeat, consumer, member, g.DurationArg(ttl))
	return g.Wrap(err)
}

// LiveMembers implements driver.GroupLeases.
func (g *GroupSQL) LiveMembers(ctx context.Context, ex driver.Executor, consumer string) ([]string, error) {
	if _, err := ex.Exec(ctx, g.DeleteExpiredMembers, consumer); err != nil {
		return nil, g.Wrap(err)
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
		return nil, g.Wrap(err)
	}
	slices.Sort(out) // byte order, whatever the column's collation
	return out, nil
}

// LeaveGroup implements driver.GroupLeases.
func (g *GroupSQL) LeaveGroup(ctx context.Context, ex driver.Executor, consumer, member string) error {
	_, err := ex.Exec(ctx, g.DeleteMember, consumer, member)
	return g.Wrap(err)
}

// AcquirePartition implements driver.GroupLeases: the conditional upsert,
// then a read of the row, which tells whether member owns it (the upsert's
// row count does not: MySQL counts unchanged rows as 0).
func (g *GroupSQL) AcquirePartition(ctx context.Context, ex driver.Executor, consumer, member string, partition int, ttl time.Duration) (driver.PartitionLease, bool, error) {
	if _, err := ex.Exec(ctx, g.Acquire, consumer, partition, member, g.DurationArg(ttl)); err != nil {
		return driver.PartitionLease{}, false, g.Wrap(err)
	}
	var (
		owner *string
		live  bool
	)
	l := driver.PartitionLease{Partition: partition}
	err := driver.QueryRow(ctx, ex, g.SelectPartition, []any{consumer, partition}, &owner, &l.Epoch, g.timeDest(&l.Until), &live)
	if err != nil {
		return driver.PartitionLease{}, false, g.Wrap(err)
	}
	if owner == nil || *owner != member || !live {
		return driver.PartitionLease{}, false, nil
	}
	return l, true, nil
}

// RenewPartitions implements driver.GroupLeases.
func (g *GroupSQL) RenewPartitions(ctx context.Context, ex driver.Executor, consumer, member string, held []int, ttl time.Duration) ([]int, error) {
	nums := make([]string, len(held))
	for i, p := range held {
		nums[i] = strconv.Itoa(p)
	}
	if _, err := ex.Exec(ctx, g.Renew, g.DurationArg(ttl), consumer, member, strings.Join(nums, ",")); err != nil {
		return nil, g.Wrap(err)
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
		return nil, g.Wrap(err)
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
func (g *GroupSQL) ReleasePartition(ctx context.Context, ex driver.Executor, consumer, member string, partition int) (bool, error) {
	n, err := ex.Exec(ctx, g.Release, consumer, partition, member)
	return n == 1, g.Wrap(err)
}

// ListGroups implements driver.GroupLeases.
func (g *GroupSQL) ListGroups(ctx context.Context, ex driver.Executor, consumer string) (driver.GroupStatus, error) {
	var s driver.GroupStatus
	if err := driver.QueryRow(ctx, ex, g.Now, nil, g.timeDest(&s.Now)); err != nil {
		return driver.GroupStatus{}, g.Wrap(err)
	}
	err := driver.QueryRows(ctx, ex, g.ListMembers, []any{consumer, consumer}, func(rows driver.Rows) error {
		var m driver.GroupMember
		if err := rows.Scan(&m.Consumer, &m.ID, g.timeDest(&m.Until)); err != nil {
			return err
		}
		s.Members = append(s.Members, m)
		return nil
	})
	if err != nil {
		return driver.GroupStatus{}, g.Wrap(err)
	}
	err = driver.QueryRows(ctx, ex, g.ListPartitions, []any{consumer, consumer}, func(rows driver.Rows) error {
		var (
			p     driver.PartitionOwner
			owner *string
		)
		if err := rows.Scan(&p.Consumer, &p.Partition, &owner, &p.Epoch, g.timeDest(&p.Until)); err != nil {
			return err
		}
		if owner != nil {
			p.Owner = *owner
		}
		s.Partitions = append(s.Partitions, p)
		return nil
	})
	if err != nil {
		return driver.GroupStatus{}, g.Wrap(err)
	}
	return s, nil
}

// GroupFlavor is what differs between the dialects whose statements take ?
// placeholders (MySQL, SQLite) in their GroupSQL.
type GroupFlavor struct {
	// Member and Partition are the quoted, qualified tables.
	Member, Partition string
	// Now is the SQL expression of the database's current time, comparable
	// with the timestamp columns.
	Now string
	// NowPlus is Now plus the ttl bound to its one placeholder.
	NowPlus string
	// InList is the condition that partition_no is in the comma-separated
	// list of numbers bound to its one placeholder.
	InList string
	// Heartbeat is GroupSQL.Heartbeat (an upsert).
	Heartbeat string
	// Acquire is GroupSQL.Acquire (a conditional upsert).
	Acquire string
	// DurationArg, TimeDest and Wrap are GroupSQL's.
	DurationArg func(time.Duration) any
	TimeDest    func(*time.Time) any
	Wrap        func(error) error
}

// QuestionMarkGroupSQL returns the GroupSQL of f: the statements MySQL and
// SQLite share, with f's upserts.
func QuestionMarkGroupSQL(f GroupFlavor) *GroupSQL {
	m, p := f.Member, f.Partition
	return &GroupSQL{
		Heartbeat:            f.Heartbeat,
		DeleteExpiredMembers: `DELETE FROM ` + m + ` WHERE consumer_name = ? AND lease_until <= ` + f.Now,
		SelectLiveMembers:    `SELECT member_id FROM ` + m + ` WHERE consumer_name = ? AND lease_until > ` + f.Now,
		DeleteMember:         `DELETE FROM ` + m + ` WHERE consumer_name = ? AND member_id = ?`,
		Acquire:              f.Acquire,
		SelectPartition: `SELECT owner, epoch, lease_until, COALESCE(lease_until > ` + f.Now + `, 0)
FROM ` + p + ` WHERE consumer_name = ? AND partition_no = ?`,
		Renew: `UPDATE ` + p + ` SET lease_until = ` + f.NowPlus + `
WHERE consumer_name = ? AND owner = ? AND ` + f.InList + ` AND lease_until > ` + f.Now,
		SelectOwned: `SELECT partition_no FROM ` + p + ` WHERE consumer_name = ? AND owner = ? AND lease_until > ` + f.Now,
		Release: `UPDATE ` + p + ` SET owner = NULL, lease_until = NULL
WHERE consumer_name = ? AND partition_no = ? AND owner = ?`,
		Now: `SELECT ` + f.Now,
		ListMembers: `SELECT consumer_name, member_id, lease_until FROM ` + m + `
WHERE ? = '' OR consumer_name = ?
ORDER BY consumer_name, member_id`,
		ListPartitions: `SELECT consumer_name, partition_no, owner, epoch, lease_until FROM ` + p + `
WHERE ? = '' OR consumer_name = ?
ORDER BY consumer_name, partition_no`,
		DurationArg: f.DurationArg,
		TimeDest:    f.TimeDest,
		Wrap:        f.Wrap,
	}
}
