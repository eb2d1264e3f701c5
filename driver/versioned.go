package driver

// UpsertVersionedParams are the parameters of Dialect.UpsertVersioned: a
// row of Table identified by KeyColumn = Key, holding VersionColumn and
// Columns.
type UpsertVersionedParams struct {
	// Table is the table, optionally schema-qualified ("shipping.order_status").
	// Each part is quoted by the dialect.
	Table string
	// KeyColumn is the column identifying the aggregate; it has a primary or
	// unique key.
	KeyColumn string
	// VersionColumn is the integer version column.
	VersionColumn string
	// Columns are the state columns, in the order of Values.
	Columns []string
	// Key identifies the row.
	Key any
	// Version is the version the values are of.
	Version int64
	// Values are the state, one per column.
	Values []any
}

// UpsertVersionedResult is what Dialect.UpsertVersioned did.
type UpsertVersionedResult struct {
	// Applied is true when the row was inserted or updated.
	Applied bool
	// Previous is the version stored before, whether the row was updated or
	// the version was stale (not newer); 0 when there was no row.
	Previous int64
}
