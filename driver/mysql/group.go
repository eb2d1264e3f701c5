package mysql

import (
	"context"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/sqltime"
)

var _ driver.GroupLeases = (*Dialect)(nil)

// newGroupSQL returns the statements of the ownership groups (migration
// 0008) on the quoted tables member and partition.
func newGroupSQL(member, partition string, wrap func(error) error) *dialectkit.GroupSQL {
	const (
		now     = "UTC_TIMESTAMP(6)"
		nowPlus = "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"
	)
	return dialectkit.QuestionMarkGroupSQL(dialectkit.GroupFlavor{
		Member:    member,
		Partition: partition,
		Now:       now,
		NowPlus:   nowPlus,
		InList:    "FIND_IN_SET(partition_no, ?) > 0",
		Heartbeat: `INSERT INTO ` + member + ` (consumer_name, member_id, lease_until) VALUES (?, ?, ` + nowPlus + `)
ON DUPLICATE KEY UPDATE lease_until = VALUES(lease_until)`,
		// MySQL runs the assignments left to right, each seeing the values
		// the previous ones set: epoch first (from the row as it was),
		// then owner, then lease_until, which follows the owner.
		Acquire: `INSERT INTO ` + partition + ` (consumer_name, partition_no, owner, epoch, lease_until)
VALUES (?, ?, ?, 1, ` + nowPlus + `)
ON DUPLICATE KEY UPDATE
    epoch = IF(owner IS NULL OR lease_until IS NULL OR lease_until <= ` + now + ` OR owner = VALUES(owner),
        IF(owner = VALUES(owner) AND lease_until > ` + now + `, epoch, epoch + 1), epoch),
    owner = IF(owner IS NULL OR lease_until IS NULL OR lease_until <= ` + now + ` OR owner = VALUES(owner),
        VALUES(owner), owner),
    lease_until = IF(owner = VALUES(owner), VALUES(lease_until), lease_until)`,
		DurationArg: func(d time.Duration) any { return d.Microseconds() },
		TimeDest:    func(t *time.Time) any { return sqltime.Scanner(t) },
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
