package postgres

import (
	"time"

	"github.com/idem-go/idem/driver/internal/dialectkit"
)

// newGroupSQL returns the statements of the ownership groups (migration
// 0008) on the quoted, qualified tables member and partition. now() is
// the time of the statement's own transaction: every statement here runs
// on its own.
func newGroupSQL(member, partition string) dialectkit.GroupSQL {
	return dialectkit.GroupSQL{
		Heartbeat: `INSERT INTO ` + member + ` (consumer_name, member_id, lease_until)
VALUES ($1, $2, now() + $3::float8 * interval '1 second')
ON CONFLICT (consumer_name, member_id) DO UPDATE SET lease_until = excluded.lease_until`,
		DeleteExpiredMembers: `DELETE FROM ` + member + ` WHERE consumer_name = $1 AND lease_until <= now()`,
		SelectLiveMembers:    `SELECT member_id FROM ` + member + ` WHERE consumer_name = $1 AND lease_until > now()`,
		DeleteMember:         `DELETE FROM ` + member + ` WHERE consumer_name = $1 AND member_id = $2`,
		// SET reads the row as it was before the update; a concurrent
		// acquirer waits for the row lock, then rechecks WHERE on the row
		// the first one committed.
		Acquire: `INSERT INTO ` + partition + ` AS p (consumer_name, partition_no, owner, epoch, lease_until)
VALUES ($1, $2, $3, 1, now() + $4::float8 * interval '1 second')
ON CONFLICT (consumer_name, partition_no) DO UPDATE SET
    epoch = CASE WHEN p.owner = excluded.owner AND p.lease_until > now() THEN p.epoch ELSE p.epoch + 1 END,
    owner = excluded.owner,
    lease_until = excluded.lease_until
WHERE p.owner IS NULL OR p.lease_until IS NULL OR p.lease_until <= now() OR p.owner = excluded.owner`,
		SelectPartition: `SELECT owner, epoch, lease_until, COALESCE(lease_until > now(), false)
FROM ` + partition + ` WHERE consumer_name = $1 AND partition_no = $2`,
		Renew: `UPDATE ` + partition + ` SET lease_until = now() + $1::float8 * interval '1 second'
WHERE consumer_name = $2 AND owner = $3 AND partition_no = ANY(string_to_array($4, ',')::integer[])
  AND lease_until > now()`,
		SelectOwned: `SELECT partition_no FROM ` + partition + ` WHERE consumer_name = $1 AND owner = $2 AND lease_until > now()`,
		Release: `UPDATE ` + partition + ` SET owner = NULL, lease_until = NULL
WHERE consumer_name = $1 AND partition_no = $2 AND owner = $3`,
		Now: `SELECT now()`,
		ListMembers: `SELECT consumer_name, member_id, lease_until FROM ` + member + `
WHERE $1::text = '' OR consumer_name = $2
ORDER BY consumer_name, member_id`,
		ListPartitions: `SELECT consumer_name, partition_no, owner, epoch, lease_until FROM ` + partition + `
WHERE $1::text = '' OR consumer_name = $2
ORDER BY consumer_name, partition_no`,
		DurationArg: func(d time.Duration) any { return d.Seconds() },
		TimeDest:    dialectkit.NullTime,
	}
}
