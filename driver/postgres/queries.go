package postgres

import (
	"fmt"
	"strings"

	"github.com/idem-go/idem/driver/internal/dialectkit"
)

// queries holds every statement of the dialect, rendered once for the
// configured table names.
type queries struct {
	outbox string

	markProcessedOne  string
	markProcessedMany string
	processedHashes   string
	purgeProcessed    string

	recordAttempt string
	clearAttempts string
	purgeAttempts string

	insertFailed     string
	updateFailed     string
	changeFailed     string
	listFailedNewest string
	listFailedOldest string
	countFailed      string
	purgeFailed      string
	parkedAggregates string
	failed           dialectkit.FailedSQL
}

func newQueries(outbox, processed, failed, attempts string) queries {
	// jsonb is read as text: any text a jsonb holds is valid, where a cast
	// to bytea would read its backslashes as escapes.
	const failedColumns = `id, consumer_name, source, event_id::text, event_name, message_key, headers::text,
       body, error, errors::text, attempts, first_failed_at, failed_at, aggregate_type, aggregate_id, held_by,
       original_body, original_headers::text, archived_at, actions::text`
	const failedWhere = `WHERE ($1 = '' OR consumer_name = $1) AND ($2 = '' OR event_name = $2)
  AND ($3 = '' OR aggregate_type = $3) AND ($4 = '' OR aggregate_id = $4)
  AND ($5::bigint = 0 OR held_by = $5::bigint) AND ($6::timestamptz IS NULL OR failed_at >= $6)
  AND ($7::bigint = 0 OR id < $7::bigint) AND ($8::bigint = 0 OR id > $8::bigint)
  AND (archived_at IS NOT NULL) = $9::boolean`
	return queries{
		outbox: outbox,

		markProcessedOne: `INSERT INTO ` + processed + ` (consumer_name, event_id, payload_hash) VALUES ($1, $2, NULLIF($3::bigint, 0))
ON CONFLICT (consumer_name, event_id) DO NOTHING`,
		markProcessedMany: `INSERT INTO ` + processed + ` (consumer_name, event_id, payload_hash)
SELECT $1, m.id, NULLIF(m.hash, 0) FROM unnest($2::uuid[], $3::bigint[]) AS m(id, hash)
ON CONFLICT (consumer_name, event_id) DO NOTHING
RETURNING event_id::text`,
		processedHashes: `SELECT event_id::text, payload_hash FROM ` + processed + `
WHERE consumer_name = $1 AND event_id = ANY($2::uuid[]) AND payload_hash IS NOT NULL`,
		purgeProcessed: `DELETE FROM ` + processed + ` WHERE (consumer_name, event_id) IN (
    SELECT consumer_name, event_id FROM ` + processed + `
    WHERE processed_at < $1 AND ($2 = '' OR consumer_name = $2)
    ORDER BY processed_at
    LIMIT $3)`,

		recordAttempt: `INSERT INTO ` + attempts + ` AS a (consumer_name, event_id, attempts, last_error)
VALUES ($1, $2, 1, $3)
ON CONFLICT (consumer_name, event_id) DO UPDATE SET
    attempts       = a.attempts + 1,
    last_error     = EXCLUDED.last_error,
    last_failed_at = now()
RETURNING attempts`,
		clearAttempts: `DELETE FROM ` + attempts + ` WHERE consumer_name = $1 AND event_id = ANY($2::uuid[])`,
		purgeAttempts: `DELETE FROM ` + attempts + ` WHERE (consumer_name, event_id) IN (
    SELECT consumer_name, event_id FROM ` + attempts + `
    WHERE last_failed_at < $1 AND ($2 = '' OR consumer_name = $2)
    ORDER BY last_failed_at
    LIMIT $3)`,

		insertFailed: `INSERT INTO ` + failed + `
    (consumer_name, source, event_id, event_name, message_key, headers, body, error, errors, attempts,
     aggregate_type, aggregate_id, held_by)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8,
    jsonb_build_array(jsonb_build_object('at', now(), 'attempt', $9::integer, 'error', $8::text)), $9,
    $10, $11, $12)
RETURNING id`,
		// The message the entry holds stays as it was first stored (or as
		// an operator edited it). An archived entry that fails again is
		// not archived any more.
		updateFailed: `UPDATE ` + failed + ` AS f SET
    error       = $3,
    errors      = f.errors || jsonb_build_array(jsonb_build_object('at', now(), 'attempt', $4::integer, 'error', $3::text)),
    attempts    = f.attempts + $4::integer,
    held_by     = $5,
    failed_at   = now(),
    archived_at = NULL
WHERE f.id = $1 AND f.consumer_name = $2
RETURNING f.id`,
		// An edit keeps the message as first stored, once; every change
		// appends its action to the audit trail.
		changeFailed: `UPDATE ` + failed + ` AS f SET
    original_body    = CASE WHEN $2 THEN COALESCE(f.original_body, f.body) ELSE f.original_body END,
    original_headers = CASE WHEN $2 THEN COALESCE(f.original_headers, f.headers) ELSE f.original_headers END,
    body             = CASE WHEN $2 THEN $3::bytea ELSE f.body END,
    headers          = CASE WHEN $2 THEN $4::jsonb ELSE f.headers END,
    archived_at      = CASE WHEN $5 THEN COALESCE(f.archived_at, now()) ELSE f.archived_at END,
    actions          = f.actions || $6::jsonb
WHERE f.id = $1`,
		listFailedNewest: `SELECT ` + failedColumns + ` FROM ` + failed + `
` + failedWhere + `
ORDER BY id DESC
LIMIT $10::integer`,
		listFailedOldest: `SELECT ` + failedColumns + ` FROM ` + failed + `
` + failedWhere + `
ORDER BY id
LIMIT $10::integer`,
		countFailed: `SELECT count(*) FROM ` + failed + `
` + failedWhere,
		purgeFailed: `DELETE FROM ` + failed + ` WHERE id IN (
    SELECT id FROM ` + failed + `
    WHERE failed_at < $1 AND ($2 = '' OR consumer_name = $2)
    ORDER BY failed_at
    LIMIT $3)`,
		parkedAggregates: `SELECT f.aggregate_type, f.aggregate_id, min(f.id)
FROM ` + failed + ` f
JOIN unnest($2::text[], $3::text[]) AS a(type, id) ON f.aggregate_type = a.type AND f.aggregate_id = a.id
WHERE f.consumer_name = $1 AND f.held_by IS NULL AND f.aggregate_id <> '' AND f.archived_at IS NULL
GROUP BY f.aggregate_type, f.aggregate_id`,
		failed: dialectkit.FailedSQL{
			Find: `SELECT id FROM ` + failed + `
WHERE consumer_name = $1 AND event_id = $2 AND (body = $3 OR original_body = $4)
ORDER BY id
LIMIT 1`,
			Get:    `SELECT ` + failedColumns + ` FROM ` + failed + ` WHERE id = $1`,
			Delete: `DELETE FROM ` + failed + ` WHERE id = $1`,
			HasParked: `SELECT EXISTS (
    SELECT 1 FROM ` + failed + `
    WHERE consumer_name = $1 AND held_by IS NULL AND aggregate_id <> '' AND archived_at IS NULL)`,
		},
	}
}

// insertOutbox returns a multi-row insert of n outbox rows, with their
// not_before when delayed, and their content_type and payload_binary when
// typed (dialectkit.InsertOutboxRows).
func (q queries) insertOutbox(n int, delayed, typed bool) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + q.outbox + ` (id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers`)
	per := 8
	if delayed {
		b.WriteString(`, not_before`)
		per++
	}
	if typed {
		b.WriteString(`, content_type, payload_binary`)
		per += 2
	}
	b.WriteString(`) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		p := i * per
		fmt.Fprintf(&b, "($%d, $%d, $%d, $%d, $%d::jsonb, $%d, $%d, $%d::jsonb", p+1, p+2, p+3, p+4, p+5, p+6, p+7, p+8)
		next := p + 9
		if delayed {
			fmt.Fprintf(&b, ", $%d::timestamptz", next)
			next++
		}
		if typed {
			fmt.Fprintf(&b, ", $%d, $%d::bytea", next, next+1)
		}
		b.WriteString(")")
	}
	return b.String()
}
