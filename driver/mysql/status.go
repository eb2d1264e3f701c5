package mysql

import (
	"context"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/sqlrelay"
)

var _ driver.StatusReader = (*Dialect)(nil)

// newStatusSQL returns the statements of ReadStatus.
func newStatusSQL(outbox, processed, failed, attempts string) dialectkit.StatusSQL {
	consumer, consumerArgs := sqlrelay.StatusConsumer(processed, failed, attempts)
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
		Consumer:     consumer,
		ConsumerArgs: consumerArgs,
		Time:         sqltimeDest,
	}
}

// ReadStatus implements driver.StatusReader.
func (d *Dialect) ReadStatus(ctx context.Context, ex driver.Executor, p driver.StatusParams) (driver.Status, error) {
	s := d.status
	s.IsMissingTable, s.Wrap = d.IsMissingTable, d.wrap
	return dialectkit.ReadStatus(ctx, ex, s, p)
}
