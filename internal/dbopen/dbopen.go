// Package dbopen opens a database from a URL for the idem and shop commands:
// postgres:// (and postgresql://) now; mysql:// and sqlite: as their dialects
// arrive.
package dbopen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
)

// DB is an open database with the drivers idem's commands use.
type DB struct {
	// URL is the URL it was opened with (may hold a password: log Redacted).
	URL string
	// SQL is a database/sql driver, available for every dialect.
	SQL *driver.SQLDriver
	// Pgx is set for PostgreSQL.
	Pgx *postgres.PgxDriver
}

// Redacted returns the URL without its password.
func (db *DB) Redacted() string { return broker.RedactURL(db.URL) }

// Dialect returns the database's dialect.
func (db *DB) Dialect() driver.Dialect { return db.SQL.Dialect() }

// Close closes every handle.
func (db *DB) Close() {
	if db.Pgx != nil {
		db.Pgx.Pgx().Close()
	}
	if db.SQL != nil {
		_ = db.SQL.DB().Close()
	}
}

// Open opens rawURL with tables and checks that the server answers.
func Open(ctx context.Context, rawURL string, tables driver.Tables) (*DB, error) {
	if rawURL == "" {
		return nil, errors.New("no database URL: pass --db or set IDEM_DB_URL (for example postgres://user:pass@localhost:5432/app)")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("database URL %s: %w", broker.RedactURL(rawURL), err)
	}
	switch strings.ToLower(u.Scheme) {
	case "postgres", "postgresql":
		return openPostgres(ctx, rawURL, tables)
	case "":
		return nil, fmt.Errorf("database URL %q has no scheme: want postgres://…", broker.RedactURL(rawURL))
	default:
		return nil, fmt.Errorf("database URL scheme %q is not supported: want postgres://…", u.Scheme)
	}
}

func openPostgres(ctx context.Context, rawURL string, tables driver.Tables) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("database URL %s: %w", broker.RedactURL(rawURL), err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", broker.RedactURL(rawURL), err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to %s: %w", broker.RedactURL(rawURL), err)
	}
	pgxDrv, err := postgres.NewPgxTables(pool, tables)
	if err != nil {
		pool.Close()
		return nil, err
	}
	sqlDB, err := sql.Open("pgx", rawURL)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &DB{URL: rawURL, SQL: driver.NewSQL(sqlDB, pgxDrv.Dialect()), Pgx: pgxDrv}, nil
}
