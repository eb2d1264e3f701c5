package mysql

import (
	"context"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/sqltime"
)

var _ driver.StatusReader = (*Dialect)(nil)

// newStatusSQL returns the statements of ReadStatus.
func newStatusSQL(outbox, processed, failed, attempts string) dialectkit.StatusSQL {
	return dialectkit.StatusSQL{
		Now: `SELECT UTC_TIMESTAMP(6)`,
		// pending_idx (published_at, quarantined_at, seq) answers each part:
		// two ranges, the first entry of one, and its greatest published_at.
		Outbox: `SELECT
    (SELECT COUNT(*) FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL),
    (SELECT created_at FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL ORDER BY seq LIMIT 1),
    (SELECT COUNT(*) FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NOT NULL),
    (SELECT MAX(published_at) FROM ` + outbox + `)`,
		// GROUP BY on the first column of a key is a loose index scan
		// ("Using index for group-by"): one probe per name.
		Names: `SELECT 0, consumer_name FROM ` + processed + ` GROUP BY consumer_name
UNION ALL SELECT 0, consumer_name FROM ` + attempts + ` GROUP BY consumer_name
UNION ALL SELECT 1, consumer_name FROM ` + failed + ` GROUP BY consumer_name`,
		// consumer_idx (consumer_name, processed_at) gives the latest marker
		// in one probe and the window's markers as a range; failed_message's
		// event_key and delivery_attempt's primary key start with
		// consumer_name.
		Consumer: `SELECT
    (SELECT MAX(processed_at) FROM ` + processed + ` WHERE consumer_name = ?),
    (SELECT COUNT(*) FROM ` + processed + ` WHERE consumer_name = ? AND processed_at > ?),
    (SELECT COUNT(*) FROM ` + failed + ` WHERE consumer_name = ?),
    (SELECT MIN(first_failed_at) FROM ` + failed + ` WHERE consumer_name = ?),
    (SELECT COUNT(*) FROM ` + attempts + ` WHERE consumer_name = ?)`,
		ConsumerArgs: func(name, encoded string, since time.Time) []any {
			return []any{name, name, sqltime.Format(since), encoded, encoded, name}
		},
		Time: sqltimeDest,
	}
}

// ReadStatus implements driver.StatusReader.
func (d *Dialect) ReadStatus(ctx context.Context, ex driver.Executor, p driver.StatusParams) (driver.Status, error) {
	s := d.status
	s.IsMissingTable, s.Wrap = d.IsMissingTable, d.wrap
	return dialectkit.ReadStatus(ctx, ex, s, p)
}
