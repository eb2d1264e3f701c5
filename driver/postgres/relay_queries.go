package postgres

import "strings"

// relayQueries holds every statement of the polling relay, rendered once for
// the configured outbox table.
type relayQueries struct {
	// claimLock serialises claims on the table, so that each claim sees the
	// leases of every claim committed before it.
	claimLock string
	// claimHeads selects aggregates' heads: unpublished rows with no
	// unpublished row of their aggregate before them, whose lease is free or
	// expired, and whose next unpublished row is not under a lease (a row
	// committed late, with a lower seq than rows already in flight, waits
	// for them: the rows a worker holds are always a run that follows its
	// head).
	claimHeads string
	// claimFollowers selects, per head, the unpublished rows after it.
	claimFollowers string
	// claimUpdate writes the lease and returns the claimed rows.
	claimUpdate string

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
		claimLock: `SELECT pg_advisory_xact_lock(7193, ((` + literal + `::regclass::oid::bigint) - 2147483648)::integer)`,

		claimHeads: `SELECT o.id::text, o.aggregatetype, o.aggregateid, o.seq, o.lease_owner IS NOT NULL
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
LIMIT $1
FOR UPDATE OF o SKIP LOCKED`,

		claimFollowers: `SELECT h.n, f.id::text, f.lease_owner IS NOT NULL, coalesce(f.lease_until > now(), false)
FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS h(aggregatetype, aggregateid, seq, n)
CROSS JOIN LATERAL (
    SELECT o.id, o.seq, o.lease_owner, o.lease_until FROM ` + outbox + ` o
    WHERE o.aggregatetype = h.aggregatetype AND o.aggregateid = h.aggregateid
      AND o.published_at IS NULL AND o.seq > h.seq
    ORDER BY o.seq
    LIMIT $4
    FOR UPDATE) f
ORDER BY h.n, f.seq`,

		claimUpdate: `UPDATE ` + outbox + `
SET lease_owner = $1, lease_until = now() + $2::float8 * interval '1 second'
WHERE id = ANY($3::uuid[])
RETURNING ` + relayColumns,

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
