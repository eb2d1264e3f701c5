package driver

import (
	"context"
	"database/sql"
	"errors"
)

// SQLDriver is a Driver for database/sql, whatever the dialect. Dialect
// packages wrap it (postgres.NewSQL, mysql.New, sqlite.New); applications
// rarely build one directly.
type SQLDriver struct {
	db      *sql.DB
	dialect Dialect
}

var _ Driver[*sql.Tx] = (*SQLDriver)(nil)

// NewSQL returns a Driver running dialect's queries on db.
func NewSQL(db *sql.DB, dialect Dialect) *SQLDriver {
	return &SQLDriver{db: db, dialect: dialect}
}

// DB returns the underlying database handle.
func (d *SQLDriver) DB() *sql.DB { return d.db }

// Dialect implements Driver.
func (d *SQLDriver) Dialect() Dialect { return d.dialect }

// Pool implements Driver.
func (d *SQLDriver) Pool() Executor { return SQLExecutor{Q: d.db} }

// Begin implements Driver.
func (d *SQLDriver) Begin(ctx context.Context) (*sql.Tx, error) { return d.db.BeginTx(ctx, nil) }

// Commit implements Driver.
func (d *SQLDriver) Commit(_ context.Context, tx *sql.Tx) error { return tx.Commit() }

// Rollback implements Driver.
func (d *SQLDriver) Rollback(_ context.Context, tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// Tx implements Driver.
func (d *SQLDriver) Tx(tx *sql.Tx) Executor { return SQLExecutor{Q: tx} }

// InTx implements Transactor.
func (d *SQLDriver) InTx(ctx context.Context, fn func(Executor) error) error { return InTx(ctx, d, fn) }

// SQLQuerier is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type SQLQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// SQLExecutor adapts a database/sql handle to Executor.
type SQLExecutor struct{ Q SQLQuerier }

// Exec implements Executor.
func (e SQLExecutor) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.Q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Query implements Executor.
func (e SQLExecutor) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rows, err := e.Q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}
