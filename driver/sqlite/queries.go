package sqlite

import (
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/sqlbase"
	"github.com/idem-go/idem/driver/internal/versioned"
)

// The current time as the timestamp columns hold it (UTC text), and plus
// a number of seconds.
const (
	now     = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
	nowPlus = "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)"
)

// flavor returns the statements of SQLite that differ from MySQL's, on the
// tables of n.
func flavor(n dialectkit.Names) sqlbase.Flavor {
	outbox, failed, partition := n.Outbox, n.FailedMessage, n.ConsumerPartition
	return sqlbase.Flavor{
		Spec: dialectkit.Spec{
			Status: dialectkit.StatusSQL{
				// pending_idx, quarantined_idx and published_at_idx each
				// answer their part.
				Outbox: `SELECT
    (SELECT COUNT(*) FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL),
    (SELECT created_at FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL ORDER BY seq LIMIT 1),
    (SELECT COUNT(*) FROM ` + outbox + ` WHERE quarantined_at IS NOT NULL),
    (SELECT MAX(published_at) FROM ` + outbox + ` WHERE published_at IS NOT NULL)`,
				Scheduled: dialectkit.ScheduledSQL(outbox, now),
				Names: looseNames("0", n.ProcessedEvent) + `
UNION ALL ` + looseNames("0", n.DeliveryAttempt) + `
UNION ALL ` + looseNames("1", n.FailedMessage),
			},
			Groups: dialectkit.GroupSQL{
				Heartbeat: `INSERT INTO ` + n.ConsumerMember + ` (consumer_name, member_id, lease_until) VALUES (?, ?, ` + nowPlus + `)
ON CONFLICT (consumer_name, member_id) DO UPDATE SET lease_until = excluded.lease_until`,
				// SET reads the row as it was before the update.
				Acquire: `INSERT INTO ` + partition + ` (consumer_name, partition_no, owner, epoch, lease_until)
VALUES (?, ?, ?, 1, ` + nowPlus + `)
ON CONFLICT (consumer_name, partition_no) DO UPDATE SET
    epoch = CASE WHEN ` + partition + `.owner = excluded.owner AND ` + partition + `.lease_until > ` + now + `
        THEN ` + partition + `.epoch ELSE ` + partition + `.epoch + 1 END,
    owner = excluded.owner,
    lease_until = excluded.lease_until
WHERE ` + partition + `.owner IS NULL OR ` + partition + `.lease_until IS NULL
   OR ` + partition + `.lease_until <= ` + now + ` OR ` + partition + `.owner = excluded.owner`,
			},
		},

		Now:         now,
		NowPlus:     nowPlus,
		DurationArg: func(d time.Duration) any { return fmt.Sprintf("%+.6f seconds", d.Seconds()) },
		PauseUpsert: `ON CONFLICT (kind, name) DO UPDATE SET starts_at = excluded.starts_at, ends_at = excluded.ends_at,
    reason = excluded.reason, paused_by = excluded.paused_by, paused_at = excluded.paused_at`,
		DeleteOldest: deleteOldest,
		RowValues:    "VALUES ",

		// SQLite has one writer at a time and no FOR UPDATE: a claim is
		// plain reads and an UPDATE in a transaction that holds the write
		// lock from its first statement (ClaimLock writes nothing but takes
		// the lock even in a deferred transaction), so claims run one after
		// the other and each sees the leases of the previous ones.
		ClaimLock: "UPDATE " + outbox + " SET attempts = attempts WHERE 0",
		UnionTerm: func(sel string) string { return "SELECT * FROM (" + sel + ")" },

		GroupInList: "instr(',' || ? || ',', ',' || partition_no || ',') > 0",

		// UpsertVersioned reads the stored version, then inserts or
		// updates; the transaction holds the database's write lock
		// (immediate transactions), so nothing changes in between.
		Versioned: versioned.Flavor{Quote: QuoteIdent},

		MarkProcessedOne: `INSERT INTO ` + n.ProcessedEvent + ` (consumer_name, event_id, payload_hash) VALUES (?, ?, ?)
ON CONFLICT (consumer_name, event_id) DO NOTHING`,
		// The ids it inserted come back.
		MarkProcessedMany: func(k int) string {
			return `INSERT INTO ` + n.ProcessedEvent + ` (consumer_name, event_id, payload_hash) VALUES ` + sqlbase.Tuples(k, "(?, ?, ?)") +
				` ON CONFLICT (consumer_name, event_id) DO NOTHING RETURNING event_id`
		},
		RecordAttempt: `INSERT INTO ` + n.DeliveryAttempt + ` (consumer_name, event_id, attempts, last_error)
VALUES (?, ?, 1, ?)
ON CONFLICT (consumer_name, event_id) DO UPDATE SET
    attempts       = attempts + 1,
    last_error     = excluded.last_error,
    last_failed_at = ` + now + `
RETURNING attempts`,
		InsertFailed: `INSERT INTO ` + failed + `
    (consumer_name, source, event_id, event_name, message_key, headers, body, error, errors, attempts,
     aggregate_type, aggregate_id, held_by)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
RETURNING id`,
		// The message the entry holds stays as it was first stored (or as
		// an operator edited it); an archived entry that fails again is
		// not archived any more.
		UpdateFailed: `UPDATE ` + failed + ` SET
    error       = ?,
    errors      = json_insert(errors, '$[#]', json(?)),
    attempts    = attempts + ?,
    held_by     = ?,
    failed_at   = ` + now + `,
    archived_at = NULL
WHERE id = ? AND consumer_name = ?
RETURNING id`,
		ChangeFailed: `UPDATE ` + failed + ` SET
    original_body    = CASE WHEN ? THEN COALESCE(original_body, body) ELSE original_body END,
    original_headers = CASE WHEN ? THEN COALESCE(original_headers, headers) ELSE original_headers END,
    body             = CASE WHEN ? THEN ? ELSE body END,
    headers          = CASE WHEN ? THEN ? ELSE headers END,
    archived_at      = CASE WHEN ? THEN COALESCE(archived_at, ` + now + `) ELSE archived_at END,
    actions          = json_insert(actions, '$[#]', json(json_extract(?, '$[0]')))
WHERE id = ?`,
	}
}

// deleteOldest deletes at most ? rows of table matching where, in the
// order of order, through a subquery on the key (SQLite's DELETE takes no
// ORDER BY or LIMIT unless built with SQLITE_ENABLE_UPDATE_DELETE_LIMIT).
func deleteOldest(table, key, where, order string) string {
	match := key
	if strings.Contains(key, ",") {
		match = "(" + key + ")"
	}
	return `DELETE FROM ` + table + ` WHERE ` + match + ` IN (
    SELECT ` + key + ` FROM ` + table + `
    WHERE ` + where + `
    ORDER BY ` + order + `
    LIMIT ?)`
}

// looseNames selects the distinct consumer_name values of table by
// skipping through an index whose first column is consumer_name: one index
// probe per name, however many rows each has.
func looseNames(source, table string) string {
	return `SELECT * FROM (WITH RECURSIVE n(consumer_name) AS (
    SELECT (SELECT consumer_name FROM ` + table + ` ORDER BY consumer_name LIMIT 1)
    UNION ALL
    SELECT (SELECT t.consumer_name FROM ` + table + ` t WHERE t.consumer_name > n.consumer_name ORDER BY t.consumer_name LIMIT 1)
    FROM n WHERE n.consumer_name IS NOT NULL)
SELECT ` + source + `, consumer_name FROM n WHERE consumer_name IS NOT NULL)`
}
