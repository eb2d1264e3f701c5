// Package dbopen opens a database from a URL for the idem and shop commands:
// postgres:// (and postgresql://), mysql:// (and mariadb://), and sqlite:path
// or file:path for SQLite.
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

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/driver/sqlite"
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
func Open(ctx context.Context, rawURL string, tables idem.Tables) (*DB, error) {
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
	case "mysql", "mariadb":
		db, err := mysql.Open(rawURL)
		if err != nil {
			return nil, fmt.Errorf("database URL %s: %w", broker.RedactURL(rawURL), err)
		}
		return openSQL(ctx, rawURL, db, func(db *sql.DB) (*driver.SQLDriver, error) { return mysql.NewTables(db, tables) })
	case "sqlite", "file":
		// sqlite:shop.db, sqlite:///var/lib/shop.db, file:shop.db?_pragma=…
		path := strings.TrimPrefix(strings.TrimPrefix(rawURL, u.Scheme+":"), "//")
		if u.Scheme == "file" {
			path = rawURL
		}
		db, err := sqlite.Open(path)
		if err != nil {
			return nil, err
		}
		return openSQL(ctx, rawURL, db, func(db *sql.DB) (*driver.SQLDriver, error) { return sqlite.NewTables(db, tables) })
	case "":
		return nil, fmt.Errorf("database URL %q has no scheme: want postgres://…, mysql://… or sqlite:path", broker.RedactURL(rawURL))
	default:
		return nil, fmt.Errorf("database URL scheme %q is not supported: want postgres://…, mysql://… or sqlite:path", u.Scheme)
	}
}

// openSQL checks that db answers and binds it to its dialect.
func openSQL(ctx context.Context, rawURL string, db *sql.DB, bind func(*sql.DB) (*driver.SQLDriver, error)) (*DB, error) {
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect to %s: %w", broker.RedactURL(rawURL), err)
	}
	drv, err := bind(db)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &DB{URL: rawURL, SQL: drv}, nil
}

func openPostgres(ctx context.Context, rawURL string, tables idem.Tables) (*DB, error) {
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
