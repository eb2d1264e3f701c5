package sqlrelay

import (
	"time"

	"github.com/idem-go/idem/driver/internal/sqltime"
)

// StatusConsumer returns the per-consumer statement of
// driver.StatusReader and the function giving its arguments, for MySQL and
// SQLite (? placeholders, times as sqltime text): the latest marker and the
// markers since a time, read through processed_event's (consumer_name,
// processed_at) index, and the consumer's parked messages, oldest failure
// and attempt rows, read through keys that start with consumer_name.
func StatusConsumer(processed, failed, attempts string) (string, func(name, encoded string, since time.Time) []any) {
	return `SELECT
    (SELECT MAX(processed_at) FROM ` + processed + ` WHERE consumer_name = ?),
    (SELECT COUNT(*) FROM ` + processed + ` WHERE consumer_name = ? AND processed_at > ?),
    (SELECT COUNT(*) FROM ` + failed + ` WHERE consumer_name = ?),
    (SELECT MIN(first_failed_at) FROM ` + failed + ` WHERE consumer_name = ?),
    (SELECT COUNT(*) FROM ` + attempts + ` WHERE consumer_name = ?)`,
		func(name, encoded string, since time.Time) []any {
			return []any{name, name, sqltime.Format(since), encoded, encoded, name}
		}
}

// ConsumerCountsQuery returns the statement of driver.ConsumerCounter for
// MySQL and SQLite: a consumer's parked messages and the events it retries
// (two range scans of the primary keys, one probe of processed_event per
// attempt row). Its arguments are the consumer's name as stored in
// failed_message (failrow.Text), then as stored elsewhere.
func ConsumerCountsQuery(failed, attempts, processed string) string {
	return `SELECT
    (SELECT count(*) FROM ` + failed + ` WHERE consumer_name = ?),
    (SELECT count(*) FROM ` + attempts + ` a WHERE a.consumer_name = ?
        AND NOT EXISTS (SELECT 1 FROM ` + processed + ` p
                        WHERE p.consumer_name = a.consumer_name AND p.event_id = a.event_id))`
}
