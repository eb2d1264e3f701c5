package sqlite

import "strings"

// queries holds every statement of the dialect, rendered once for the
// configured table names.
type queries struct {
	outbox, processed, failed, attempts string

	markProcessedOne string
	purgeProcessed   string

	recordAttempt string
	purgeAttempts string

	insertFailed        string
	updateFailed        string
	findFailed          string
	listFailedNewest    string
	listFailedOldest    string
	getFailed           string
	deleteFailed        string
	purgeFailed         string
	hasParkedAggregates string
}

func newQueries(outbox, processed, failed, attempts string) queries {
	const failedColumns = `id, consumer_name, source, event_id, event_name, message_key, headers, body,
       error, errors, attempts, first_failed_at, failed_at, aggregate_type, aggregate_id, held_by`
	const failedWhere = `WHERE (? = '' OR consumer_name = ?) AND (? = '' OR event_name = ?)
  AND (? = '' OR aggregate_type = ?) AND (? = '' OR aggregate_id = ?)
  AND (? = 0 OR held_by = ?) AND (? IS NULL OR failed_at >= ?)
  AND (? = 0 OR id < ?) AND (? = 0 OR id > ?)`
	const now = `strftime('%Y-%m-%d %H:%M:%f', 'now')`
	return queries{
		outbox:    outbox,
		processed: processed,
		failed:    failed,
		attempts:  attempts,

		markProcessedOne: `INSERT INTO ` + processed + ` (consumer_name, event_id, payload_hash) VALUES (?, ?, ?)
ON CONFLICT (consumer_name, event_id) DO NOTHING`,
		purgeProcessed: `DELETE FROM ` + processed + ` WHERE (consumer_name, event_id) IN (
    SELECT consumer_name, event_id FROM ` + processed + `
    WHERE processed_at < ? AND (? = '' OR consumer_name = ?)
    ORDER BY processed_at
    LIMIT ?)`,

		recordAttempt: `INSERT INTO ` + attempts + ` (consumer_name, event_id, attempts, last_error)
VALUES (?, ?, 1, ?)
ON CONFLICT (consumer_name, event_id) DO UPDATE SET
    attempts       = attempts + 1,
    last_error     = excluded.last_error,
    last_failed_at = ` + now + `
RETURNING attempts`,
		purgeAttempts: `DELETE FROM ` + attempts + ` WHERE (consumer_name, event_id) IN (
    SELECT consumer_name, event_id FROM ` + attempts + `
    WHERE last_failed_at < ? AND (? = '' OR consumer_name = ?)
    ORDER BY last_failed_at
    LIMIT ?)`,

		insertFailed: `INSERT INTO ` + failed + `
    (consumer_name, source, event_id, event_name, message_key, headers, body, error, errors, attempts,
     aggregate_type, aggregate_id, held_by)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
RETURNING id`,
		// The message the entry holds stays as it was first stored.
		updateFailed: `UPDATE ` + failed + ` SET
    error     = ?,
    errors    = json_insert(errors, '$[#]', json(?)),
    attempts  = attempts + ?,
    held_by   = ?,
    failed_at = ` + now + `
WHERE id = ? AND consumer_name = ?
RETURNING id`,
		findFailed: `SELECT id FROM ` + failed + `
WHERE consumer_name = ? AND event_id = ? AND body = ?
ORDER BY id
LIMIT 1`,
		listFailedNewest: `SELECT ` + failedColumns + ` FROM ` + failed + `
` + failedWhere + `
ORDER BY id DESC
LIMIT ?`,
		listFailedOldest: `SELECT ` + failedColumns + ` FROM ` + failed + `
` + failedWhere + `
ORDER BY id
LIMIT ?`,
		getFailed:    `SELECT ` + failedColumns + ` FROM ` + failed + ` WHERE id = ?`,
		deleteFailed: `DELETE FROM ` + failed + ` WHERE id = ?`,
		purgeFailed: `DELETE FROM ` + failed + ` WHERE id IN (
    SELECT id FROM ` + failed + `
    WHERE failed_at < ? AND (? = '' OR consumer_name = ?)
    ORDER BY failed_at
    LIMIT ?)`,
		hasParkedAggregates: `SELECT EXISTS (
    SELECT 1 FROM ` + failed + `
    WHERE consumer_name = ? AND held_by IS NULL AND aggregate_id <> '')`,
	}
}

// insertOutbox returns a multi-row insert of n outbox rows.
func (q queries) insertOutbox(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + q.outbox + ` (id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers) VALUES `)
	writeTuples(&b, n, "(?, ?, ?, ?, ?, ?, ?, ?)")
	return b.String()
}

// markProcessedMany returns a multi-row insert of n markers that returns the
// ids it inserted.
func (q queries) markProcessedMany(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + q.processed + ` (consumer_name, event_id, payload_hash) VALUES `)
	writeTuples(&b, n, "(?, ?, ?)")
	b.WriteString(" ON CONFLICT (consumer_name, event_id) DO NOTHING RETURNING event_id")
	return b.String()
}

// processedHashes returns the query of the hashes of n ids.
func (q queries) processedHashes(n int) string {
	var b strings.Builder
	b.WriteString(`SELECT event_id, payload_hash FROM ` + q.processed + `
WHERE consumer_name = ? AND payload_hash IS NOT NULL AND event_id IN (`)
	writeTuples(&b, n, "?")
	b.WriteString(")")
	return b.String()
}

// clearAttempts returns the delete of n ids' attempt counts.
func (q queries) clearAttempts(n int) string {
	var b strings.Builder
	b.WriteString(`DELETE FROM ` + q.attempts + ` WHERE consumer_name = ? AND event_id IN (`)
	writeTuples(&b, n, "?")
	b.WriteString(")")
	return b.String()
}

// parkedAggregates returns the query of the oldest parked message of n
// aggregates.
func (q queries) parkedAggregates(n int) string {
	var b strings.Builder
	b.WriteString(`SELECT aggregate_type, aggregate_id, MIN(id) FROM ` + q.failed + `
WHERE consumer_name = ? AND held_by IS NULL AND aggregate_id <> ''
  AND (aggregate_type, aggregate_id) IN (VALUES `)
	writeTuples(&b, n, "(?, ?)")
	b.WriteString(`)
GROUP BY aggregate_type, aggregate_id`)
	return b.String()
}

// writeTuples writes n copies of tuple separated by commas.
func writeTuples(b *strings.Builder, n int, tuple string) {
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(tuple)
	}
}
