package postgres

// consumerCountsQuery counts a consumer's parked messages and the events it
// retries (driver.ConsumerCounter): two range scans of the primary keys,
// one probe of processed_event per attempt row.
func consumerCountsQuery(failed, attempts, processed string) string {
	return `SELECT
    (SELECT count(*) FROM ` + failed + ` WHERE consumer_name = $1 AND archived_at IS NULL),
    (SELECT count(*) FROM ` + attempts + ` a WHERE a.consumer_name = $2
        AND NOT EXISTS (SELECT 1 FROM ` + processed + ` p
                        WHERE p.consumer_name = a.consumer_name AND p.event_id = a.event_id))`
}
