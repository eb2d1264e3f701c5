package mysql

import (
	"context"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/failrow"
)

var _ driver.ConsumerCounter = (*Dialect)(nil)

// consumerCountsQuery counts a consumer's parked messages and the events it
// retries (driver.ConsumerCounter): two range scans of the primary keys,
// one probe of processed_event per attempt row.
func (d *Dialect) consumerCountsQuery() string {
	failed, attempts, processed := d.qualify(d.tables.FailedMessage), d.qualify(d.tables.DeliveryAttempt), d.qualify(d.tables.ProcessedEvent)
	return `SELECT
    (SELECT count(*) FROM ` + failed + ` WHERE consumer_name = ?),
    (SELECT count(*) FROM ` + attempts + ` a WHERE a.consumer_name = ?
        AND NOT EXISTS (SELECT 1 FROM ` + processed + ` p
                        WHERE p.consumer_name = a.consumer_name AND p.event_id = a.event_id))`
}

// ConsumerCounts implements driver.ConsumerCounter.
func (d *Dialect) ConsumerCounts(ctx context.Context, ex driver.Executor, consumer string) (driver.ConsumerCounts, error) {
	var c driver.ConsumerCounts
	err := driver.QueryRow(ctx, ex, d.consumerCountsQuery(), []any{failrow.Text(consumer), consumer}, &c.Parked, &c.Retrying)
	return c, d.wrap(err)
}
