package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem/driver"
)

// StateCopy keeps a local copy of another service's aggregate state, applying
// only newer versions: the first article's versioned upsert. Deduplication
// skips copies of the same event; the version check also ignores an older
// event that arrives after a newer one.
//
//	var orderStatus = inbox.StateCopy{Table: "order_status", Key: "order_id",
//		Columns: []string{"status"}}
//	res, err := inbox.ApplyState(ctx, consumer.Driver(), tx, orderStatus, orderID, ev.AggregateVersion, "cancelled")
//
// The table needs a primary or unique key on Key and an integer version
// column.
type StateCopy struct {
	// Table is the copy's table, optionally schema-qualified ("shipping.order_status").
	Table string
	// Key is the column identifying the aggregate.
	Key string
	// Version is the version column. Defaults to "version".
	Version string
	// Columns are the state columns, in the order of ApplyState's values.
	Columns []string
}

// VersionResult reports what ApplyState did.
type VersionResult struct {
	// Applied is true when the row was inserted or updated.
	Applied bool
	// Previous is the version stored before, whether the event was applied
	// or stale; 0 when there was no row.
	Previous int64
	// Gap is true when the applied version skipped at least one version
	// after Previous: an event is missing or still on its way. Log and count
	// it; the version check cannot rebuild the missing event.
	Gap bool
}

// Stale reports whether the event was older than (or as old as) the stored
// state and changed nothing.
func (r VersionResult) Stale() bool { return !r.Applied }

// ApplyState upserts (key, version, values...) into s's table if version is
// newer than the stored one, in tx, the handler's transaction: a late, older
// event changes nothing (VersionResult.Stale). Each dialect runs it as it
// can (driver.Dialect.UpsertVersioned); concurrent calls for one key are
// serialised on its row.
func ApplyState[TTx any](ctx context.Context, drv driver.Driver[TTx], tx TTx, s StateCopy, key any, version int64, values ...any) (VersionResult, error) {
	if len(values) != len(s.Columns) {
		return VersionResult{}, fmt.Errorf("idem: inbox: StateCopy %s: %d values for %d columns", s.Table, len(values), len(s.Columns))
	}
	if s.Table == "" || s.Key == "" {
		return VersionResult{}, errors.New("idem: inbox: StateCopy needs Table and Key")
	}
	r, err := drv.Dialect().UpsertVersioned(ctx, drv.Tx(tx), driver.UpsertVersionedParams{
		Table: s.Table, KeyColumn: s.Key, VersionColumn: cmp.Or(s.Version, "version"), Columns: s.Columns,
		Key: key, Version: version, Values: values,
	})
	if err != nil {
		return VersionResult{}, fmt.Errorf("idem: inbox: StateCopy %s: %w", s.Table, err)
	}
	return VersionResult{Applied: r.Applied, Previous: r.Previous, Gap: r.Applied && r.Previous > 0 && version > r.Previous+1}, nil
}
