package postgres

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
)

// PgxDriver is the Driver for pgx v5: transactions are pgx.Tx.
type PgxDriver struct {
	pool    *pgxpool.Pool
	dialect *dialect
}

var _ driver.Driver[pgx.Tx] = (*PgxDriver)(nil)

// NewPgx returns a driver on pool using the default table names.
func NewPgx(pool *pgxpool.Pool) *PgxDriver {
	return &PgxDriver{pool: pool, dialect: mustDialect(idem.Tables{})}
}

// NewPgxTables returns a driver on pool using tables.
func NewPgxTables(pool *pgxpool.Pool, tables idem.Tables) (*PgxDriver, error) {
	d, err := newDialect(tables)
	if err != nil {
		return nil, err
	}
	return &PgxDriver{pool: pool, dialect: d}, nil
}

// Pgx returns the underlying pool.
func (d *PgxDriver) Pgx() *pgxpool.Pool { return d.pool }

// Dialect implements driver.Driver.
func (d *PgxDriver) Dialect() driver.Dialect { return d.dialect }

// Pool implements driver.Driver.
func (d *PgxDriver) Pool() driver.Executor { return PgxExecutor{Q: d.pool} }

// Begin implements driver.Driver.
func (d *PgxDriver) Begin(ctx context.Context) (pgx.Tx, error) { return d.pool.Begin(ctx) }

// Commit implements driver.Driver.
func (d *PgxDriver) Commit(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }

// Rollback implements driver.Driver.
func (d *PgxDriver) Rollback(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// Tx implements driver.Driver.
func (d *PgxDriver) Tx(tx pgx.Tx) driver.Executor { return PgxExecutor{Q: tx} }

// InTx implements driver.Transactor.
func (d *PgxDriver) InTx(ctx context.Context, fn func(driver.Executor) error) error {
	return driver.InTx(ctx, d, fn)
}

// PgxQuerier is what *pgxpool.Pool, *pgx.Conn and pgx.Tx have in common.
type PgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// PgxExecutor adapts a pgx handle to driver.Executor.
type PgxExecutor struct{ Q PgxQuerier }

// Exec implements driver.Executor.
func (e PgxExecutor) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := e.Q.Exec(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// Query implements driver.Executor.
func (e PgxExecutor) Query(ctx context.Context, sql string, args ...any) (driver.Rows, error) {
	rows, err := e.Q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}

type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}

// NewSQL returns a database/sql driver on db, which must use the pgx stdlib
// driver (import _ "github.com/jackc/pgx/v5/stdlib", sql.Open("pgx", url)),
// with the default table names.
func NewSQL(db *sql.DB) *driver.SQLDriver {
	return driver.NewSQL(db, MustDialect(idem.Tables{}))
}

// NewSQLTables is NewSQL with configured table names.
func NewSQLTables(db *sql.DB, tables idem.Tables) (*driver.SQLDriver, error) {
	return dialectkit.NewSQL(db, tables, NewDialect)
}
