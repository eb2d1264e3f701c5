package postgres

import (
	"strings"

	"github.com/idem-go/idem/driver/internal/dialectkit"
)

// relayQueries holds every statement of the polling relay, rendered once for
// the configured outbox table.
type relayQueries struct {
	// claimLock serialises claims on the table, so that each claim sees the
	// leases of every claim committed before it. It also lets the claim
	// commit without waiting for its WAL flush: a lease lost in a crash of
	// the server only means that its rows are published again, which
	// consumers deduplicate, and a claim must not wait behind the disk.
	claimLock string
	// waitLock and waitUnlock take and give back the session advisory lock
	// a relay holds while it waits for notifications: the outbox trigger
	// (migration 0006) notifies only when it cannot take it shared.
	waitLock, waitTryLock, waitUnlock string
	// waitCheck says whether a claim could find rows: an unpublished,
	// unquarantined row whose lease is free or expired, with no unpublished
	// row of its aggregate before it. The listener runs it once it holds
	// the wait lock, and after every batch while it holds it, and wakes the
	// relay only when it says yes: a relay that keeps up does not claim
	// once more for nothing after each batch.
	waitCheck string
	// claim selects aggregates' heads, the rows that follow them, leases
	// them and returns them, in one statement run after claimLock. Heads
	// are unpublished rows with no unpublished row of their aggregate before
	// them, whose lease is free or expired, and whose next unpublished row
	// is not under a lease (a row committed late, with a lower seq than rows
	// already in flight, waits for them: the rows a worker holds are always
	// a run that follows its head). At most $5 heads are taken; each brings
	// up to $2 of the rows after it, within the room the heads leave in the
	// batch of $1, and stops before a row still waiting for a retry delay
	// or quarantined. A quarantined row is never a head, and the rows after
	// it in its aggregate are not heads either: they have an unpublished row
	// before them.
	//
	// Every part reads only rows whose not_before is NULL (pending_idx and
	// aggregate_pending_idx hold no others, migration 0012): a delayed row
	// is invisible to the claim until promoteDue, run before it in the
	// same transaction, clears its not_before. Until then it is neither a
	// head nor a row before one, so it holds back nothing of its
	// aggregate; once due, it is an ordinary row at its place in seq
	// order, claimed when no row before it waits and none after it is
	// leased.
	claim string
	// promoteDue clears not_before on the unpublished rows due at $1 (the
	// relay's clock), through scheduled_idx: rows not due are never read.
	// created_at takes the due time: the row waits from then on, for the
	// status's oldest-waiting age and the relay's commit-to-publish delay.
	promoteDue string
	// nextDue selects the earliest not_before of the unpublished rows
	// (NULL when none), for a relay about to sleep longer than its poll
	// interval.
	nextDue string

	markPublished   string
	release         string
	quarantine      string
	deletePublished string
	backlog         string
	scheduled       string
	replayCounts    string
	replayRows      string

	// The operators' statements on quarantined rows; see quarantineWhere.
	listQuarantined    string
	getQuarantined     string
	requeueQuarantined string
	deleteQuarantined  string
}

const relayColumns = `id::text, aggregatetype, aggregateid, type, payload::text, occurred_at,
    aggregate_version, headers::text, seq, created_at, attempts, content_type, payload_binary`

// quarantineWhere selects quarantined rows by event name ($1), aggregate
// type ($2) and id ($3), and quarantine time ($4). Quarantined rows are
// always unpublished: a row is quarantined by the worker that leases it,
// which frees the lease, and only a lease's owner marks a row published.
const quarantineWhere = `quarantined_at IS NOT NULL
  AND ($1::text = '' OR type = $1::text)
  AND ($2::text = '' OR aggregatetype = $2::text)
  AND ($3::text = '' OR aggregateid = $3::text)
  AND ($4::timestamptz IS NULL OR quarantined_at >= $4::timestamptz)`

// replayWhere selects published rows by period ($1, $2), event name ($3)
// and aggregate type ($4).
const replayWhere = `published_at IS NOT NULL
  AND ($1::timestamptz IS NULL OR occurred_at >= $1::timestamptz)
  AND ($2::timestamptz IS NULL OR occurred_at < $2::timestamptz)
  AND ($3::text = '' OR type = $3::text)
  AND ($4::text = '' OR aggregatetype = $4::text)`

func newRelayQueries(outbox string) relayQueries {
	literal := "'" + strings.ReplaceAll(outbox, "'", "''") + "'"
	return relayQueries{
		waitLock:    `SELECT pg_advisory_lock(7194, ((` + literal + `::regclass::oid::bigint) - 2147483648)::integer)`,
		waitTryLock: `SELECT pg_try_advisory_lock(7194, ((` + literal + `::regclass::oid::bigint) - 2147483648)::integer)`,
		waitUnlock:  `SELECT pg_advisory_unlock(7194, ((` + literal + `::regclass::oid::bigint) - 2147483648)::integer)`,
		waitCheck: `SELECT EXISTS (
    SELECT 1 FROM ` + outbox + ` o
    WHERE o.published_at IS NULL AND o.quarantined_at IS NULL AND o.not_before IS NULL
      AND (o.lease_until IS NULL OR o.lease_until <= now())
      AND NOT EXISTS (
        SELECT 1 FROM (
          SELECT p.seq FROM ` + outbox + ` p
          WHERE p.aggregatetype = o.aggregatetype AND p.aggregateid = o.aggregateid
            AND p.published_at IS NULL AND p.not_before IS NULL AND p.seq < o.seq
          ORDER BY p.seq DESC
          LIMIT 1) prev))`,
		claimLock: `SELECT pg_advisory_xact_lock(7193, ((` + literal + `::regclass::oid::bigint) - 2147483648)::integer),
    set_config('synchronous_commit', 'off', true)`,

		claim: `WITH heads AS MATERIALIZED (
    SELECT o.seq, o.aggregatetype, o.aggregateid, o.lease_owner IS NOT NULL AS taken
    FROM ` + outbox + ` o
    WHERE o.published_at IS NULL AND o.quarantined_at IS NULL AND o.not_before IS NULL
      AND (o.lease_until IS NULL OR o.lease_until <= now())
      AND NOT EXISTS (
        -- Backwards from o: the row just before a non-head is found at once,
        -- however many published rows of the aggregate the index still holds.
        SELECT 1 FROM (
          SELECT p.seq FROM ` + outbox + ` p
          WHERE p.aggregatetype = o.aggregatetype AND p.aggregateid = o.aggregateid
            AND p.published_at IS NULL AND p.not_before IS NULL AND p.seq < o.seq
          ORDER BY p.seq DESC
          LIMIT 1) prev)
      AND NOT EXISTS (
        SELECT 1 FROM (
          SELECT n.lease_until FROM ` + outbox + ` n
          WHERE n.aggregatetype = o.aggregatetype AND n.aggregateid = o.aggregateid
            AND n.published_at IS NULL AND n.not_before IS NULL AND n.seq > o.seq
          ORDER BY n.seq
          LIMIT 1) nx
        WHERE nx.lease_until > now())
    ORDER BY o.seq
    LIMIT $5
    FOR UPDATE OF o SKIP LOCKED
),
room AS MATERIALIZED (
    SELECT ($1::bigint - count(*)) / greatest(count(*), 1) AS per_head FROM heads
),
followers AS MATERIALIZED (
    -- Nobody else can claim these rows: they are not heads, and their
    -- heads are ours.
    SELECT f.seq, f.taken,
        bool_or(f.busy) OVER (PARTITION BY h.seq ORDER BY f.seq) AS stopped
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT o.seq, o.lease_owner IS NOT NULL AS taken,
            coalesce(o.lease_until > now(), false) OR o.quarantined_at IS NOT NULL AS busy
        FROM (
            SELECT o.seq, o.lease_owner, o.lease_until, o.quarantined_at FROM ` + outbox + ` o
            WHERE o.aggregatetype = h.aggregatetype AND o.aggregateid = h.aggregateid
              AND o.published_at IS NULL AND o.not_before IS NULL AND o.seq > h.seq
            ORDER BY o.seq
            LIMIT least($2::bigint, (SELECT per_head FROM room))
            FOR UPDATE) o) f
),
claimed AS MATERIALIZED (
    SELECT seq, taken FROM heads
    UNION ALL
    SELECT f.seq, f.taken FROM followers f WHERE NOT f.stopped
),
leased AS (
    UPDATE ` + outbox + `
    SET lease_owner = $3, lease_until = now() + $4::float8 * interval '1 second'
    WHERE seq = ANY (ARRAY(SELECT seq FROM claimed))
    RETURNING ` + relayColumns + `
)
SELECT l.*, c.taken FROM leased l JOIN claimed c ON c.seq = l.seq
ORDER BY l.seq`,

		promoteDue: `UPDATE ` + outbox + ` SET created_at = not_before, not_before = NULL
WHERE published_at IS NULL AND not_before IS NOT NULL AND not_before <= $1`,
		nextDue: `SELECT min(not_before) FROM ` + outbox + `
WHERE published_at IS NULL AND not_before IS NOT NULL`,

		markPublished: `UPDATE ` + outbox + `
SET published_at = now(), lease_owner = NULL, lease_until = NULL
WHERE seq = ANY($2::bigint[]) AND lease_owner = $1`,

		release: `UPDATE ` + outbox + ` o
SET lease_owner = NULL,
    lease_until = CASE WHEN r.error = '' THEN NULL ELSE now() + r.delay * interval '1 second' END,
    attempts    = o.attempts + CASE WHEN r.error <> '' AND r.refused THEN 1 ELSE 0 END,
    last_error  = CASE WHEN r.error = '' THEN o.last_error ELSE r.error END
FROM unnest($2::bigint[], $3::text[], $4::float8[], $5::bool[]) AS r(seq, error, delay, refused)
WHERE o.seq = r.seq AND o.lease_owner = $1`,

		quarantine: `UPDATE ` + outbox + ` o
SET lease_owner = NULL, lease_until = NULL, attempts = o.attempts + 1,
    last_error = r.error, quarantined_at = now()
FROM unnest($2::bigint[], $3::text[]) AS r(seq, error)
WHERE o.seq = r.seq AND o.lease_owner = $1
RETURNING o.seq`,

		listQuarantined: `SELECT ` + relayColumns + `, quarantined_at, coalesce(last_error, '')
FROM ` + outbox + `
WHERE ` + quarantineWhere + `
  AND seq > $5
ORDER BY seq
LIMIT $6`,

		getQuarantined: `SELECT ` + relayColumns + `, quarantined_at, coalesce(last_error, '')
FROM ` + outbox + `
WHERE seq = $1 AND quarantined_at IS NOT NULL`,

		// The row is written again, seq and every other column kept, rather
		// than updated: the polling relay claims it as it would an updated
		// one, and the CDC relay, which reads inserts only, publishes it.
		requeueQuarantined: `WITH d AS (
    DELETE FROM ` + outbox + `
    WHERE seq = ANY($1::bigint[]) AND quarantined_at IS NOT NULL
    RETURNING *
)
INSERT INTO ` + outbox + ` OVERRIDING SYSTEM VALUE
SELECT (jsonb_populate_record(NULL::` + outbox + `, to_jsonb(d) ||
    '{"quarantined_at": null, "attempts": 0, "lease_owner": null, "lease_until": null}'::jsonb)).*
FROM d`,

		deleteQuarantined: `DELETE FROM ` + outbox + `
WHERE seq = ANY($1::bigint[]) AND quarantined_at IS NOT NULL`,

		deletePublished: `DELETE FROM ` + outbox + ` WHERE id IN (
    SELECT id FROM ` + outbox + `
    WHERE published_at < $1
    ORDER BY published_at
    LIMIT $2)`,

		backlog: `SELECT
    (SELECT count(*) FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL),
    (SELECT created_at FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL ORDER BY seq LIMIT 1),
    (SELECT count(*) FROM ` + outbox + ` WHERE quarantined_at IS NOT NULL)`,

		scheduled: dialectkit.ScheduledSQL(outbox, "now()"),
		replayCounts: `SELECT type, count(*) FROM ` + outbox + `
WHERE ` + replayWhere + `
GROUP BY type
ORDER BY type`,

		replayRows: `SELECT ` + relayColumns + ` FROM ` + outbox + `
WHERE ` + replayWhere + `
  AND seq > $5
ORDER BY seq
LIMIT $6`,
	}
}
