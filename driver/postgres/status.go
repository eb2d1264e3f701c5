package postgres

import (
	"time"

	"github.com/idem-go/idem/driver/internal/dialectkit"
)

// looseNames selects the distinct consumer_name values of table by
// skipping through an index whose first column is consumer_name: one index
// probe per name, however many rows each has (PostgreSQL has no loose index
// scan of its own before version 18).
func looseNames(source, table string) string {
	return `(WITH RECURSIVE n AS (
    (SELECT consumer_name FROM ` + table + ` ORDER BY consumer_name LIMIT 1)
    UNION ALL
    SELECT (SELECT t.consumer_name FROM ` + table + ` t WHERE t.consumer_name > n.consumer_name ORDER BY t.consumer_name LIMIT 1)
    FROM n WHERE n.consumer_name IS NOT NULL)
SELECT ` + source + `, consumer_name FROM n WHERE consumer_name IS NOT NULL)`
}

// newStatusSQL returns the statements of ReadStatus.
func newStatusSQL(outbox, processed, failed, attempts string) dialectkit.StatusSQL {
	return dialectkit.StatusSQL{
		Now: `SELECT now()`,
		// pending_idx, quarantined_idx and published_at_idx each answer
		// their part.
		Outbox: `SELECT
    (SELECT count(*) FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL),
    (SELECT created_at FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL ORDER BY seq LIMIT 1),
    (SELECT count(*) FROM ` + outbox + ` WHERE quarantined_at IS NOT NULL),
    (SELECT max(published_at) FROM ` + outbox + ` WHERE published_at IS NOT NULL)`,
		Scheduled: dialectkit.ScheduledSQL(outbox, "now()"),
		Names: looseNames("0", processed) + `
UNION ALL ` + looseNames("0", attempts) + `
UNION ALL ` + looseNames("1", failed),
		// processed_event_consumer_idx (consumer_name, processed_at) gives
		// the latest marker in one probe and the window's markers as a
		// range; failed_message's event_idx and delivery_attempt's primary
		// key start with consumer_name.
		Consumer: `SELECT
    (SELECT max(processed_at) FROM ` + processed + ` WHERE consumer_name = $1),
    (SELECT count(*) FROM ` + processed + ` WHERE consumer_name = $1 AND processed_at > $2),
    (SELECT count(*) FROM ` + failed + ` WHERE consumer_name = $3 AND archived_at IS NULL),
    (SELECT min(first_failed_at) FROM ` + failed + ` WHERE consumer_name = $3 AND archived_at IS NULL),
    (SELECT count(*) FROM ` + attempts + ` WHERE consumer_name = $1)`,
		ConsumerArgs: func(name, encoded string, since time.Time) []any { return []any{name, since, encoded} },
		Time:         dialectkit.NullTime,
	}
}
