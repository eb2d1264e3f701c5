package sqlite

import "strings"

// queries holds every statement of the dialect, rendered once for the
// configured table names.
type queries struct {
	outbox, processed string

	markProcessedOne string
	purgeProcessed   string

	saveFailed   string
	listFailed   string
	getFailed    string
	deleteFailed string
}

func newQueries(outbox, processed, failed string) queries {
	const failedColumns = `id, consumer_name, source, event_id, event_name, message_key, headers, body,
       error, errors, attempts, first_failed_at, failed_at`
	return queries{
		outbox:    outbox,
		processed: processed,

		markProcessedOne: `INSERT INTO ` + processed + ` (consumer_name, event_id) VALUES (?, ?)
ON CONFLICT (consumer_name, event_id) DO NOTHING`,
		purgeProcessed: `DELETE FROM ` + processed + ` WHERE (consumer_name, event_id) IN (
    SELECT consumer_name, event_id FROM ` + processed + `
    WHERE processed_at < ? AND (? = '' OR consumer_name = ?)
    ORDER BY processed_at
    LIMIT ?)`,

		saveFailed: `INSERT INTO ` + failed + `
    (consumer_name, source, event_id, event_name, message_key, headers, body, error, errors, attempts)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (consumer_name, event_id) DO UPDATE SET
    source      = excluded.source,
    event_name  = excluded.event_name,
    message_key = excluded.message_key,
    headers     = excluded.headers,
    body        = excluded.body,
    error       = excluded.error,
    errors      = json_insert(errors, '$[#]', json(?)),
    attempts    = attempts + excluded.attempts,
    failed_at   = strftime('%Y-%m-%d %H:%M:%f', 'now')
RETURNING id`,
		listFailed: `SELECT ` + failedColumns + ` FROM ` + failed + `
WHERE (? = '' OR consumer_name = ?) AND (? = '' OR event_name = ?) AND (? IS NULL OR failed_at >= ?)
ORDER BY failed_at DESC, id DESC
LIMIT ?`,
		getFailed:    `SELECT ` + failedColumns + ` FROM ` + failed + ` WHERE id = ?`,
		deleteFailed: `DELETE FROM ` + failed + ` WHERE id = ?`,
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
		b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?)")
	}
	return b.String()
}

// markProcessedMany returns a multi-row insert of n markers that returns the
// ids it inserted.
func (q queries) markProcessedMany(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + q.processed + ` (consumer_name, event_id) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?)")
	}
	b.WriteString(" ON CONFLICT (consumer_name, event_id) DO NOTHING RETURNING event_id")
	return b.String()
}
