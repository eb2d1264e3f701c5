package mysql

import (
	"time"

	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/sqlbase"
	"github.com/idem-go/idem/driver/internal/versioned"
)

// The current time as the DATETIME(6) columns hold it (UTC), and plus a
// number of microseconds.
const (
	now     = "UTC_TIMESTAMP(6)"
	nowPlus = "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"
)

// flavor returns the statements of MySQL that differ from SQLite's, on the
// tables of n.
func flavor(n dialectkit.Names) sqlbase.Flavor {
	outbox, failed, member, partition := n.Outbox, n.FailedMessage, n.ConsumerMember, n.ConsumerPartition
	return sqlbase.Flavor{
		Spec: dialectkit.Spec{
			Status: dialectkit.StatusSQL{
				// pending_idx (published_at, quarantined_at, not_before,
				// seq) answers each part: two ranges, the first entry of
				// one, and its greatest published_at; scheduled_idx
				// (published_at, not_before) the delayed rows.
				Outbox: `SELECT
    (SELECT COUNT(*) FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL),
    (SELECT created_at FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL ORDER BY seq LIMIT 1),
    (SELECT COUNT(*) FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NOT NULL),
    (SELECT MAX(published_at) FROM ` + outbox + `)`,
				LogPosition: `SELECT gtid_pos, updated_at FROM ` + n.BinlogPosition + ` WHERE outbox_table = '` + n.OutboxName + `'`,
				// GROUP BY on the first column of a key is a loose index scan
				// ("Using index for group-by"): one probe per name.
				Scheduled: dialectkit.ScheduledSQL(outbox, now),
				Names: `SELECT 0, consumer_name FROM ` + n.ProcessedEvent + ` GROUP BY consumer_name
UNION ALL SELECT 0, consumer_name FROM ` + n.DeliveryAttempt + ` GROUP BY consumer_name
UNION ALL SELECT 1, consumer_name FROM ` + n.FailedMessage + ` GROUP BY consumer_name`,
			},
			Groups: dialectkit.GroupSQL{
				Heartbeat: `INSERT INTO ` + member + ` (consumer_name, member_id, lease_until) VALUES (?, ?, ` + nowPlus + `)
ON DUPLICATE KEY UPDATE lease_until = VALUES(lease_until)`,
				// MySQL runs the assignments left to right, each seeing
				// the values the previous ones set: epoch first (from the
				// row as it was), then owner, then lease_until, which
				// follows the owner.
				Acquire: `INSERT INTO ` + partition + ` (consumer_name, partition_no, owner, epoch, lease_until)
VALUES (?, ?, ?, 1, ` + nowPlus + `)
ON DUPLICATE KEY UPDATE
    epoch = IF(owner IS NULL OR lease_until IS NULL OR lease_until <= ` + now + ` OR owner = VALUES(owner),
        IF(owner = VALUES(owner) AND lease_until > ` + now + `, epoch, epoch + 1), epoch),
    owner = IF(owner IS NULL OR lease_until IS NULL OR lease_until <= ` + now + ` OR owner = VALUES(owner),
        VALUES(owner), owner),
    lease_until = IF(owner = VALUES(owner), VALUES(lease_until), lease_until)`,
			},
		},

		Now:         now,
		NowPlus:     nowPlus,
		DurationArg: func(d time.Duration) any { return d.Microseconds() },
		PauseUpsert: `ON DUPLICATE KEY UPDATE starts_at = VALUES(starts_at), ends_at = VALUES(ends_at),
    reason = VALUES(reason), paused_by = VALUES(paused_by), paused_at = VALUES(paused_at)`,
		DeleteOldest: func(table, _, where, order string) string {
			return `DELETE FROM ` + table + `
WHERE ` + where + `
ORDER BY ` + order + `
LIMIT ?`
		},
		// A plain insert: the duplicate-key error on the primary key is the
		// conflict (INSERT IGNORE would also hide every other error).
		IsKeyConflict: func(err error, table string) bool { return IsDuplicateKey(err, table, "PRIMARY") },

		// Claims lock the single row of the claim-lock table first: claims
		// run one after the other, and each reads (InnoDB creates a
		// transaction's snapshot at its first plain read, after the lock)
		// the leases of every claim committed before it. The heads are
		// found by a plain read of pending_idx in seq order (PendingHint: the
		// seq index would also read every published row the table keeps),
		// and the rows after them by a plain read of each aggregate's range
		// of aggregate_pending_idx (AggregateHint); the heads are then locked
		// by primary key with FOR UPDATE SKIP LOCKED and rechecked. No range
		// of pending rows is locked, so producers inserting rows never
		// deadlock with a claim: every locking lookup by seq goes through
		// the seq index (BySeq), never a range of pending_idx. MySQL has no
		// LISTEN/NOTIFY: relays poll (relay.Config.PollInterval, jittered).
		ClaimLock:     "UPDATE " + n.ClaimLock + " SET id = id WHERE id = 1",
		BySeq:         outbox + " FORCE INDEX (" + QuoteIdent(n.OutboxName+"_seq_idx") + ")",
		PendingHint:   " FORCE INDEX (" + QuoteIdent(n.OutboxName+"_pending_idx") + ")",
		AggregateHint: " FORCE INDEX (" + QuoteIdent(n.OutboxName+"_aggregate_pending_idx") + ")",
		HeadsLock:     "FOR UPDATE SKIP LOCKED",
		UnionTerm:     func(sel string) string { return "(" + sel + ")" },

		GroupInList: "FIND_IN_SET(partition_no, ?) > 0",

		// A key not stored yet is inserted; a stored one is read with
		// SELECT ... FOR UPDATE, which locks its row, then updated if the
		// version is newer. A missing key is not read with the lock first:
		// InnoDB would lock the gap where it goes, and two transactions
		// inserting new keys into that gap would deadlock.
		Versioned: versioned.Flavor{
			Quote: QuoteIdent, Lock: " FOR UPDATE",
			IsDuplicateKey: func(err error) bool { return IsDuplicateKey(err, "", "") },
		},

		MarkProcessedOne: `INSERT INTO ` + n.ProcessedEvent + ` (consumer_name, event_id, payload_hash) VALUES (?, ?, ?)`,
		MarkProcessedMany: func(k int) string {
			return `INSERT INTO ` + n.ProcessedEvent + ` (consumer_name, event_id, payload_hash) VALUES ` + sqlbase.Tuples(k, "(?, ?, ?)")
		},
		// LAST_INSERT_ID(expr) makes the driver's result carry the count
		// after an update; an insert counts 1.
		RecordAttempt: `INSERT INTO ` + n.DeliveryAttempt + ` (consumer_name, event_id, attempts, last_error)
VALUES (?, ?, 1, ?)
ON DUPLICATE KEY UPDATE
    attempts       = LAST_INSERT_ID(attempts + 1),
    last_error     = VALUES(last_error),
    last_failed_at = ` + now,
		InsertFailed: `INSERT INTO ` + failed + `
    (consumer_name, source, event_id, event_name, message_key, headers, body, ` + "`error`, `errors`" + `, attempts,
     aggregate_type, aggregate_id, held_by)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		// The message the entry holds stays as it was first stored (or as
		// an operator edited it); an archived entry that fails again is
		// not archived any more. The history always grows, so a matched
		// row is a changed row: the count of affected rows says whether
		// the entry was there, with or without clientFoundRows.
		UpdateFailed: `UPDATE ` + failed + ` SET
    ` + "`error`" + `     = ?,
    ` + "`errors`" + `    = JSON_MERGE_PRESERVE(` + "`errors`" + `, ?),
    attempts    = attempts + ?,
    held_by     = ?,
    failed_at   = ` + now + `,
    archived_at = NULL
WHERE id = ? AND consumer_name = ?`,
		ChangeFailed: `UPDATE ` + failed + ` SET
    original_body    = IF(?, COALESCE(original_body, body), original_body),
    original_headers = IF(?, COALESCE(original_headers, headers), original_headers),
    body             = IF(?, ?, body),
    headers          = IF(?, ?, headers),
    archived_at      = IF(?, COALESCE(archived_at, ` + now + `), archived_at),
    actions          = JSON_MERGE_PRESERVE(actions, ?)
WHERE id = ?`,
	}
}
