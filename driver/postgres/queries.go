package postgres

import (
	"fmt"
	"strings"
)

// queries holds every statement of the dialect, rendered once for the
// configured table names.
type queries struct {
	outbox string

	markProcessedOne  string
	markProcessedMany string
	purgeProcessed    string

	saveFailed   string
	listFailed   string
	getFailed    string
	deleteFailed string
}

func newQueries(outbox, processed, failed string) queries {
	const failedColumns = `id, consumer_name, source, event_id::text, event_name, message_key, headers::text::bytea,
       body, error, errors::text::bytea, attempts, first_failed_at, failed_at`
	return queries{
		outbox: outbox,

		markProcessedOne: `INSERT INTO ` + processed + ` (consumer_name, event_id) VALUES ($1, $2)
ON CONFLICT (consumer_name, event_id) DO NOTHING`,
		markProcessedMany: `INSERT INTO ` + processed + ` (consumer_name, event_id)
SELECT $1, unnest($2::uuid[])
ON CONFLICT (consumer_name, event_id) DO NOTHING
RETURNING event_id::text`,
		purgeProcessed: `DELETE FROM ` + processed + ` WHERE (consumer_name, event_id) IN (
    SELECT consumer_name, event_id FROM ` + processed + `
    WHERE processed_at < $1 AND ($2 = '' OR consumer_name = $2)
    ORDER BY processed_at
    LIMIT $3)`,

		saveFailed: `INSERT INTO ` + failed + ` AS f
    (consumer_name, source, event_id, event_name, message_key, headers, body, error, errors, attempts)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8,
    jsonb_build_array(jsonb_build_object('at', now(), 'attempt', $9::integer, 'error', $8::text)), $9)
ON CONFLICT (consumer_name, event_id) DO UPDATE SET
    source      = EXCLUDED.source,
    event_name  = EXCLUDED.event_name,
    message_key = EXCLUDED.message_key,
    headers     = EXCLUDED.headers,
    body        = EXCLUDED.body,
    error       = EXCLUDED.error,
    errors      = f.errors || EXCLUDED.errors,
    attempts    = f.attempts + EXCLUDED.attempts,
    failed_at   = now()
RETURNING id`,
		listFailed: `SELECT ` + failedColumns + ` FROM ` + failed + `
WHERE ($1 = '' OR consumer_name = $1) AND ($2 = '' OR event_name = $2) AND ($3::timestamptz IS NULL OR failed_at >= $3)
ORDER BY failed_at DESC, id DESC
LIMIT $4`,
		getFailed:    `SELECT ` + failedColumns + ` FROM ` + failed + ` WHERE id = $1`,
		deleteFailed: `DELETE FROM ` + failed + ` WHERE id = $1`,
	}
}

// insertOutbox returns a multi-row insert of n outbox rows.
func (q queries) insertOutbox(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + q.outbox + ` (id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		p := i * 8
		fmt.Fprintf(&b, "($%d, $%d, $%d, $%d, $%d::jsonb, $%d, $%d, $%d::jsonb)", p+1, p+2, p+3, p+4, p+5, p+6, p+7, p+8)
	}
	return b.String()
}
