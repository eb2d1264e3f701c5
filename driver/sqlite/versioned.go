package sqlite

import (
	"context"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/versioned"
)

// UpsertVersioned implements driver.Dialect: it reads the stored version,
// then inserts or updates; the transaction holds the database's write lock
// (immediate transactions), so nothing changes in between.
func (d *Dialect) UpsertVersioned(ctx context.Context, ex driver.Executor, p driver.UpsertVersionedParams) (driver.UpsertVersionedResult, error) {
	res, err := versioned.Flavor{Quote: QuoteIdent}.Upsert(ctx, ex, p)
	return res, d.wrap(err)
}
