package mysql

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
	const failedColumns = "id, consumer_name, source, event_id, event_name, message_key, headers, body, `error`, `errors`, attempts, first_failed_at, failed_at"
	return queries{
		outbox:    outbox,
		processed: processed,

		markProcessedOne: `INSERT INTO ` + processed + ` (consumer_name, event_id) VALUES (?, ?)`,
		purgeProcessed: `DELETE FROM ` + processed + `
WHERE processed_at < ? AND (? = '' OR consumer_name = ?)
ORDER BY processed_at
LIMIT ?`,

		// LAST_INSERT_ID(id) makes the driver's result carry the id of the
		// updated row too.
		saveFailed: `INSERT INTO ` + failed + `
    (consumer_name, source, event_id, event_name, message_key, headers, body, ` + "`error`, `errors`" + `, attempts)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE
    id          = LAST_INSERT_ID(id),
    source      = VALUES(source),
    event_name  = VALUES(event_name),
    message_key = VALUES(message_key),
    headers     = VALUES(headers),
    body        = VALUES(body),
    ` + "`error`" + `     = VALUES(` + "`error`" + `),
    ` + "`errors`" + `    = JSON_MERGE_PRESERVE(` + "`errors`" + `, VALUES(` + "`errors`" + `)),
    attempts    = attempts + VALUES(attempts),
    failed_at   = UTC_TIMESTAMP(6)`,
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

// markProcessedMany returns a multi-row insert of n markers.
func (q queries) markProcessedMany(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + q.processed + ` (consumer_name, event_id) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?)")
	}
	return b.String()
}
