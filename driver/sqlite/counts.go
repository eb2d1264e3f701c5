package sqlite

import (
	"context"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/failrow"
	"github.com/idem-go/idem/driver/internal/sqlrelay"
)

var _ driver.ConsumerCounter = (*Dialect)(nil)

// consumerCountsQuery is the statement of ConsumerCounts (sqlrelay).
func (d *Dialect) consumerCountsQuery() string {
	return sqlrelay.ConsumerCountsQuery(QuoteIdent(d.tables.FailedMessage), QuoteIdent(d.tables.DeliveryAttempt), QuoteIdent(d.tables.ProcessedEvent))
}

// ConsumerCounts implements driver.ConsumerCounter.
func (d *Dialect) ConsumerCounts(ctx context.Context, ex driver.Executor, consumer string) (driver.ConsumerCounts, error) {
	var c driver.ConsumerCounts
	err := driver.QueryRow(ctx, ex, d.consumerCountsQuery(), []any{failrow.Text(consumer), consumer}, &c.Parked, &c.Retrying)
	return c, d.wrap(err)
}
