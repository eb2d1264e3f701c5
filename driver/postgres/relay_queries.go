package postgres

import "strings"

// relayQueries holds every statement of the polling relay, rendered once for
// the configured outbox table.
type relayQueries struct {
	// claimLock serialises claims on the table, so that each claim sees the
	// leases of every claim committed before it. It also lets the claim
	// commit without waiting for its WAL flush: a lease lost in a crash of
	// the server only means that its rows are published again, which
	// consumers deduplicate, and a claim must not wait behind the disk.
	claimLock string
	// claim selects aggregates' heads, the rows that follow them, leases
	// them and returns them, in one statement run after claimLock. Heads
	// are unpublished rows with no unpublished row of their aggregate before
	// them, whose lease is free or expired, and whose next unpublished row
	// is not under a lease (a row committed late, with a lower seq than rows
	// already in flight, waits for them: the rows a worker holds are always
	// a run that follows its head). At most $5 heads are taken; each brings
	// up to $2 of the rows after it, within the room the heads leave in the
	// batch of $1, and stops before a row still waiting for a retry delay.
	claim string

	markPublished   string
	release         string
	deletePublished string
	backlog         string
	replayCounts    string
	replayRows      string
}

const relayColumns = `id::text, aggregatetype, aggregateid, type, payload::text, occurred_at,
    aggregate_version, headers::text, seq, created_at, attempts`

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
		claimLock: `SELECT pg_advisory_xact_lock(7193, ((` + literal + `::regclass::oid::bigint) - 2147483648)::integer),
    set_config('synchronous_commit', 'off', true)`,

		claim: `WITH heads AS MATERIALIZED (
    SELECT o.id, o.aggregatetype, o.aggregateid, o.seq, o.lease_owner IS NOT NULL AS taken
    FROM ` + outbox + ` o
    WHERE o.published_at IS NULL
      AND (o.lease_until IS NULL OR o.lease_until <= now())
      AND NOT EXISTS (
        -- Backwards from o: the row just before a non-head is found at once,
        -- however many published rows of the aggregate the index still holds.
        SELECT 1 FROM (
          SELECT p.seq FROM ` + outbox + ` p
          WHERE p.aggregatetype = o.aggregatetype AND p.aggregateid = o.aggregateid
            AND p.published_at IS NULL AND p.seq < o.seq
          ORDER BY p.seq DESC
          LIMIT 1) prev)
      AND NOT EXISTS (
        SELECT 1 FROM (
          SELECT n.lease_until FROM ` + outbox + ` n
          WHERE n.aggregatetype = o.aggregatetype AND n.aggregateid = o.aggregateid
            AND n.published_at IS NULL AND n.seq > o.seq
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
    SELECT f.id, f.taken,
        bool_or(f.busy) OVER (PARTITION BY h.id ORDER BY f.seq) AS stopped
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT o.id, o.seq, o.lease_owner IS NOT NULL AS taken,
            coalesce(o.lease_until > now(), false) AS busy
        FROM (
            SELECT o.id, o.seq, o.lease_owner, o.lease_until FROM ` + outbox + ` o
            WHERE o.aggregatetype = h.aggregatetype AND o.aggregateid = h.aggregateid
              AND o.published_at IS NULL AND o.seq > h.seq
            ORDER BY o.seq
            LIMIT least($2::bigint, (SELECT per_head FROM room))
            FOR UPDATE) o) f
),
claimed AS MATERIALIZED (
    SELECT id, taken FROM heads
    UNION ALL
    SELECT f.id, f.taken FROM followers f WHERE NOT f.stopped
),
leased AS (
    UPDATE ` + outbox + `
    SET lease_owner = $3, lease_until = now() + $4::float8 * interval '1 second'
    WHERE id = ANY (ARRAY(SELECT id FROM claimed))
    RETURNING ` + relayColumns + `
)
SELECT l.*, c.taken FROM leased l JOIN claimed c ON c.id = l.id::uuid
ORDER BY l.seq`,

		markPublished: `UPDATE ` + outbox + `
SET published_at = now(), lease_owner = NULL, lease_until = NULL
WHERE id = ANY($2::uuid[]) AND lease_owner = $1`,

		release: `UPDATE ` + outbox + ` o
SET lease_owner = NULL,
    lease_until = CASE WHEN r.error = '' THEN NULL ELSE now() + r.delay * interval '1 second' END,
    attempts    = o.attempts + CASE WHEN r.error = '' THEN 0 ELSE 1 END,
    last_error  = CASE WHEN r.error = '' THEN o.last_error ELSE r.error END
FROM unnest($2::uuid[], $3::text[], $4::float8[]) AS r(id, error, delay)
WHERE o.id = r.id AND o.lease_owner = $1`,

		deletePublished: `DELETE FROM ` + outbox + ` WHERE id IN (
    SELECT id FROM ` + outbox + `
    WHERE published_at < $1
    ORDER BY published_at
    LIMIT $2)`,

		backlog: `SELECT count(*),
    (SELECT created_at FROM ` + outbox + ` WHERE published_at IS NULL ORDER BY seq LIMIT 1)
FROM ` + outbox + ` WHERE published_at IS NULL`,

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
