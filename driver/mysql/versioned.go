package mysql

import (
	"context"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/versioned"
)

// UpsertVersioned implements driver.Dialect: it reads the stored version
// with SELECT ... FOR UPDATE, which locks the row (or the gap where it
// goes), then inserts or updates.
func (d *Dialect) UpsertVersioned(ctx context.Context, ex driver.Executor, p driver.UpsertVersionedParams) (driver.UpsertVersionedResult, error) {
	res, err := versioned.Flavor{Quote: QuoteIdent, Lock: " FOR UPDATE"}.Upsert(ctx, ex, p)
	return res, d.wrap(err)
}
