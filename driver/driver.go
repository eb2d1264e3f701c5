// Package driver is the seam between idem and a database. A Dialect knows one
// SQL flavour (PostgreSQL, MySQL/MariaDB, SQLite): its migrations, its queries
// and how it reports a duplicate key. A Driver binds a dialect to one
// connection API (pgx or database/sql) and its transaction type, so that the
// outbox writer and the consumer handlers work with the transactions the
// application already uses.
//
// Applications pick a driver from a dialect package, for example
// postgres.NewPgx(pool) or postgres.NewSQL(db), and pass it to outbox, inbox,
// relay or migrate. They do not call the methods of this package themselves.
package driver

import (
	"context"

	"github.com/idem-go/idem"
)

// Executor runs queries on a pool, a connection or a transaction.
type Executor interface {
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// Query runs a query that returns rows.
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// Rows is the result of Executor.Query.
//
// The contract is database/sql's: Next reports false at the end of the
// result or on an error, and only Err tells which. database/sql's Close
// returns nil after Next stopped on an error, so a loop that checks Close
// alone reads a broken result as a complete one. Read rows with ScanRows or
// QueryRows, which check Err.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// ScanRows calls scan once per row of rows, in order, then closes rows. It
// returns the first error among scan's, the iteration's (rows.Err) and
// Close's: an error in the middle of a result reaches the caller, never a
// shorter result. Every loop over Rows in idem goes through it.
func ScanRows(rows Rows, scan func(Rows) error) (err error) {
	defer func() {
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
	}()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// QueryRows runs a query on ex and calls scan once per row (see ScanRows).
func QueryRows(ctx context.Context, ex Executor, sql string, args []any, scan func(Rows) error) error {
	rows, err := ex.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	return ScanRows(rows, scan)
}

// Driver binds a Dialect to a connection API whose transactions have type TTx
// (pgx.Tx, *sql.Tx).
type Driver[TTx any] interface {
	// Dialect returns the SQL dialect, bound to the configured table names.
	Dialect() Dialect
	// Pool returns an executor that runs each statement outside any caller
	// transaction.
	Pool() Executor
	// Begin starts a transaction.
	Begin(ctx context.Context) (TTx, error)
	// Commit commits tx.
	Commit(ctx context.Context, tx TTx) error
	// Rollback rolls tx back. Rolling back a finished transaction is not an
	// error.
	Rollback(ctx context.Context, tx TTx) error
	// Tx returns an executor that runs statements in tx.
	Tx(tx TTx) Executor
}

// InTx runs fn in a transaction of drv, given the transaction's executor:
// committed when fn returns nil, rolled back otherwise (fn's error is
// returned).
func InTx[TTx any](ctx context.Context, drv Driver[TTx], fn func(Executor) error) (err error) {
	tx, err := drv.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = drv.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	if err := fn(drv.Tx(tx)); err != nil {
		return err
	}
	return drv.Commit(ctx, tx)
}

// Transactor runs a function in a transaction of its database, whatever
// its transactions' type: what the code that holds a database without its
// type parameter (inbox.FailureStore) needs to write several rows at once.
// Every driver of the dialect packages is one (SQLDriver,
// postgres.PgxDriver).
type Transactor interface {
	// InTx runs fn in a transaction, as the function InTx does.
	InTx(ctx context.Context, fn func(Executor) error) error
}

// QueryRow runs a query expected to return at most one row and scans it into
// dest. It returns idem.ErrNotFound when there is no row.
func QueryRow(ctx context.Context, ex Executor, sql string, args []any, dest ...any) error {
	found := false
	err := QueryRows(ctx, ex, sql, args, func(rows Rows) error {
		if found {
			return nil
		}
		found = true
		return rows.Scan(dest...)
	})
	if err != nil {
		return err
	}
	if !found {
		return idem.ErrNotFound
	}
	return nil
}
