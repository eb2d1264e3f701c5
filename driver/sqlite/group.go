package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
)

var _ driver.GroupLeases = (*Dialect)(nil)

// newGroupSQL returns the statements of the ownership groups (migration
// 0008) on the quoted tables member and partition.
func newGroupSQL(member, partition string, wrap func(error) error) *dialectkit.GroupSQL {
	const nowPlus = "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)"
	return dialectkit.QuestionMarkGroupSQL(dialectkit.GroupFlavor{
		Member:    member,
		Partition: partition,
		Now:       nowText,
		NowPlus:   nowPlus,
		InList:    "instr(',' || ? || ',', ',' || partition_no || ',') > 0",
		Heartbeat: `INSERT INTO ` + member + ` (consumer_name, member_id, lease_until) VALUES (?, ?, ` + nowPlus + `)
ON CONFLICT (consumer_name, member_id) DO UPDATE SET lease_until = excluded.lease_until`,
		// SET reads the row as it was before the update.
		Acquire: `INSERT INTO ` + partition + ` (consumer_name, partition_no, owner, epoch, lease_until)
VALUES (?, ?, ?, 1, ` + nowPlus + `)
ON CONFLICT (consumer_name, partition_no) DO UPDATE SET
    epoch = CASE WHEN ` + partition + `.owner = excluded.owner AND ` + partition + `.lease_until > ` + nowText + `
        THEN ` + partition + `.epoch ELSE ` + partition + `.epoch + 1 END,
    owner = excluded.owner,
    lease_until = excluded.lease_until
WHERE ` + partition + `.owner IS NULL OR ` + partition + `.lease_until IS NULL
   OR ` + partition + `.lease_until <= ` + nowText + ` OR ` + partition + `.owner = excluded.owner`,
		DurationArg: func(d time.Duration) any { return fmt.Sprintf("%+.6f seconds", d.Seconds()) },
		TimeDest:    sqltimeDest,
		Wrap:        wrap,
	})
}

// HeartbeatMember implements driver.GroupLeases.
func (d *Dialect) HeartbeatMember(ctx context.Context, ex driver.Executor, consumer, member string, ttl time.Duration) error {
	return d.group.HeartbeatMember(ctx, ex, consumer, member, ttl)
}

// LiveMembers implements driver.GroupLeases.
func (d *Dialect) LiveMembers(ctx context.Context, ex driver.Executor, consumer string) ([]string, error) {
	return d.group.LiveMembers(ctx, ex, consumer)
}

// LeaveGroup implements driver.GroupLeases.
func (d *Dialect) LeaveGroup(ctx context.Context, ex driver.Executor, consumer, member string) error {
	return d.group.LeaveGroup(ctx, ex, consumer, member)
}

// AcquirePartition implements driver.GroupLeases.
func (d *Dialect) AcquirePartition(ctx context.Context, ex driver.Executor, consumer, member string, partition int, ttl time.Duration) (driver.PartitionLease, bool, error) {
	return d.group.AcquirePartition(ctx, ex, consumer, member, partition, ttl)
}

// RenewPartitions implements driver.GroupLeases.
func (d *Dialect) RenewPartitions(ctx context.Context, ex driver.Executor, consumer, member string, held []int, ttl time.Duration) ([]int, error) {
	return d.group.RenewPartitions(ctx, ex, consumer, member, held, ttl)
}

// ReleasePartition implements driver.GroupLeases.
func (d *Dialect) ReleasePartition(ctx context.Context, ex driver.Executor, consumer, member string, partition int) (bool, error) {
	return d.group.ReleasePartition(ctx, ex, consumer, member, partition)
}

// ListGroups implements driver.GroupLeases.
func (d *Dialect) ListGroups(ctx context.Context, ex driver.Executor, consumer string) (driver.GroupStatus, error) {
	return d.group.ListGroups(ctx, ex, consumer)
}
