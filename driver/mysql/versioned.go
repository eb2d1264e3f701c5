package mysql

import (
	"context"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/versioned"
)

// UpsertVersioned implements driver.Dialect. A key not stored yet is
// inserted; a stored one is read with SELECT ... FOR UPDATE, which locks
// its row, then updated if the version is newer. A missing key is not
// read with the lock first: InnoDB would lock the gap where it goes, and
// two transactions inserting new keys into that gap would deadlock.
func (d *Dialect) UpsertVersioned(ctx context.Context, ex driver.Executor, p driver.UpsertVersionedParams) (driver.UpsertVersionedResult, error) {
	res, err := versioned.Flavor{
		Quote: QuoteIdent, Lock: " FOR UPDATE",
		IsDuplicateKey: func(err error) bool { return IsDuplicateKey(err, "", "") },
	}.Upsert(ctx, ex, p)
	return res, d.wrap(err)
}
