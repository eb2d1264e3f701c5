package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
)

// URLOptions adjust OpenURL.
type URLOptions struct {
	// Schema, when set, is the schema that holds the tables: created if it
	// does not exist, and put first on every connection's search_path, so
	// that several applications (or services) share one database, each in
	// its own schema. Empty: the URL's search_path.
	Schema string
	// Tables names idem's tables, found through the search_path unless
	// Tables.Schema is set.
	Tables idem.Tables
	// MaxConns is the pool size. 0 keeps pgxpool's: the URL's
	// pool_max_conns, else the larger of 4 and the number of CPUs.
	MaxConns int
}

// OpenURL connects to the PostgreSQL database at rawURL,
// postgres://user:pass@host:5432/db?sslmode=verify-full&sslrootcert=ca.pem
// (every parameter pgxpool.ParseConfig reads, and the PG* environment
// variables), checks that it answers, and returns the driver on its pool.
// Close the pool (PgxDriver.Pgx) when done. For code on database/sql, open
// a handle on the same pool with stdlib.OpenDBFromPool and NewSQLTables.
//
// It waits at most 15s for the schema to be created and 10s for the pool's
// first connection, less if ctx ends first.
func OpenURL(ctx context.Context, rawURL string, o URLOptions) (*PgxDriver, error) {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("idem: postgres: URL: %w", err)
	}
	if o.Schema != "" {
		if err := createSchema(ctx, cfg.ConnConfig.Copy(), o.Schema); err != nil {
			return nil, fmt.Errorf("idem: postgres: create schema %s: %w", o.Schema, err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = o.Schema
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = int32(o.MaxConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("idem: postgres: connect: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("idem: postgres: connect: %w", err)
	}
	d, err := NewPgxTables(pool, o.Tables)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return d, nil
}

// createSchema creates schema if it does not exist, on a connection of its
// own (the pool's connections get it on their search_path).
func createSchema(ctx context.Context, cfg *pgx.ConnConfig, schema string) error {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(cctx, "CREATE SCHEMA IF NOT EXISTS "+QuoteIdent(schema))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		// Two processes created it at the same moment: IF NOT EXISTS does
		// not cover the race on pg_namespace's unique index.
		return nil
	}
	return err
}
