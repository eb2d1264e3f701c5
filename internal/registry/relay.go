package registry

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/relay"
)

// Relay is a polling relay of a database (Database.NewRelay), whatever the
// driver it runs on.
type Relay interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	Done() <-chan struct{}
	Stats() relay.Stats
	Healthy() error
}

// relayExtraConns are the connections a polling relay needs besides one
// per worker: its listener (PostgreSQL) and its background loops (backlog,
// retention, the next delayed row).
const relayExtraConns = 4

// RelayConns returns the size of the connection pool that a polling relay
// of workers workers needs on dialect: one connection per worker and
// relayExtraConns for the rest; on SQLite one, whatever the workers:
// SQLite has one writer at a time, and on one connection the workers'
// claims and marks queue in order instead of polling the file's lock
// (sqlite.Open).
func RelayConns(dialect string, workers int) int {
	if dialect == SQLite {
		return 1
	}
	return workers + relayExtraConns
}

// NewRelay returns the polling relay of the database, publishing through
// pub, on a pool of at least RelayConns(db.Dialect, cfg.Workers)
// connections: on PostgreSQL through pgx (LISTEN/NOTIFY wakes it), on a
// pool of its own, opened by the first call, shared by the later ones (a
// new one when it is too small) and closed by Close; on MySQL/MariaDB and
// SQLite through database/sql, polling (every
// relay.PollIntervalNoListenDefault unless cfg.PollInterval says
// otherwise), on the database's pool, resized. The pool of a SQLite
// database keeps its size: one connection unless DatabaseOptions.MaxConns
// said more. Calls must not run concurrently.
func (db *Database) NewRelay(ctx context.Context, pub broker.Publisher, cfg relay.Config) (Relay, error) {
	conns := RelayConns(db.Dialect, cfg.WithDefaults().Workers)
	switch {
	case db.Pgx != nil:
		if db.relayPool == nil || db.relayPool.Config().MaxConns < int32(conns) {
			poolCfg := db.Pgx.Pgx().Config()
			poolCfg.MaxConns = max(poolCfg.MaxConns, int32(conns))
			pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
			if err != nil {
				return nil, fmt.Errorf("database %s: relay pool: %w", db.Redacted(), err)
			}
			closeRest := db.close
			db.close = func() { pool.Close(); closeRest() }
			db.relayPool = pool
		}
		drv, err := postgres.NewPgxTables(db.relayPool, db.SQL.Dialect().Tables())
		if err != nil {
			return nil, err
		}
		return relay.New(drv, pub, cfg)
	case db.Dialect != SQLite:
		if n := db.DB.Stats().MaxOpenConnections; n == 0 || n < conns {
			db.DB.SetMaxOpenConns(conns)
		}
		// database/sql keeps 2 idle connections by default: the workers
		// would open and close connections between their statements.
		db.DB.SetMaxIdleConns(db.DB.Stats().MaxOpenConnections)
	}
	return relay.New(db.SQL, pub, cfg)
}
