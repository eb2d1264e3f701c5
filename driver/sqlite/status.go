package sqlite

import (
	"context"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/sqlrelay"
)

var _ driver.StatusReader = (*Dialect)(nil)

// looseNames selects the distinct consumer_name values of table by
// skipping through an index whose first column is consumer_name: one index
// probe per name, however many rows each has.
func looseNames(source, table string) string {
	return `SELECT * FROM (WITH RECURSIVE n(consumer_name) AS (
    SELECT (SELECT consumer_name FROM ` + table + ` ORDER BY consumer_name LIMIT 1)
    UNION ALL
    SELECT (SELECT t.consumer_name FROM ` + table + ` t WHERE t.consumer_name > n.consumer_name ORDER BY t.consumer_name LIMIT 1)
    FROM n WHERE n.consumer_name IS NOT NULL)
SELECT ` + source + `, consumer_name FROM n WHERE consumer_name IS NOT NULL)`
}

// newStatusSQL returns the statements of ReadStatus.
func newStatusSQL(outbox, processed, failed, attempts string) dialectkit.StatusSQL {
	consumer, consumerArgs := sqlrelay.StatusConsumer(processed, failed, attempts)
	return dialectkit.StatusSQL{
		Now: `SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')`,
		// pending_idx, quarantined_idx and published_at_idx each answer
		// their part.
		Outbox: `SELECT
    (SELECT COUNT(*) FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL),
    (SELECT created_at FROM ` + outbox + ` WHERE published_at IS NULL AND quarantined_at IS NULL ORDER BY seq LIMIT 1),
    (SELECT COUNT(*) FROM ` + outbox + ` WHERE quarantined_at IS NOT NULL),
    (SELECT MAX(published_at) FROM ` + outbox + ` WHERE published_at IS NOT NULL)`,
		Names: looseNames("0", processed) + `
UNION ALL ` + looseNames("0", attempts) + `
UNION ALL ` + looseNames("1", failed),
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
