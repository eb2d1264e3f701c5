package cdc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/relay/internal/logengine"
	"github.com/idem-go/idem/relay/internal/sendspan"
	"github.com/idem-go/idem/relay/logrelay"
)

// Relay publishes the outbox's inserts and the outbox's WAL messages, read
// from a logical replication slot, through a broker.Publisher. Make one with
// New; Start and Stop it like the polling relay (logrelay.Relay). Delayed
// rows wait in the table and are published from it once due (see the
// package documentation).
//
// Start checks the server (wal_level=logical, the outbox table, the
// REPLICATION privilege) and creates the publication and the slot when they
// do not exist; a second relay on the slot waits and takes over when the
// first stops. Stop confirms to the server the position of what was
// published; messages abandoned at the end of Stop's context are published
// again from the slot. In Stats, Position and ConfirmedLSN are the slot's
// position last confirmed, LagBytes and RetainedBytes the slot's WAL.
type Relay struct {
	// Relay is the engine all log relays share.
	logrelay.Relay
}

// source is what the engine (relay/internal/logengine) reads: the slot,
// and the outbox's SQL.
type source struct {
	cfg Config
	log *slog.Logger
	eng *logengine.Relay

	dbURL   string
	replCfg *pgconn.Config

	pool   *pgxpool.Pool
	host   managedServer // the service running the server, for the hints of start-up errors (managed.go)
	schema string        // the outbox's schema, resolved at Start
	sql    queries

	// warnedRowsOnly is set once a WAL message was read with
	// Config.RowsOnly (warned once).
	warnedRowsOnly atomic.Bool

	// initial holds, from the creation of the slot until the engine
	// published them, the rows that were waiting in the outbox then
	// (sweep.go).
	initial *initialRows
	// slotLater is set when the relay started paused by an operator: the
	// first session looks for the slot, and creates it, instead of Setup.
	slotLater bool
}

// New returns a Relay reading the outbox of cfg.Tables in the database of
// dbURL (a postgres:// URL or a key=value connection string; the relay adds
// replication=database for its replication connection) and publishing
// through pub.
func New(dbURL string, pub broker.Publisher, cfg Config) (*Relay, error) {
	if pub == nil {
		return nil, errors.New("idem: cdc: New: nil publisher")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rc, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("idem: cdc: database URL: %w", err)
	}
	rc.RuntimeParams["replication"] = "database"
	log := cfg.Logger.With("slot", cfg.Slot)
	s := &source{cfg: cfg, log: log, dbURL: dbURL, replCfg: rc}
	s.eng = logengine.New(s, logengine.Config{
		Name: "cdc", Publisher: pub, Tracing: sendspan.New(TracerName, cfg.TracerProvider, cfg.Propagator, pub),
		Window: cfg.Window, BatchSize: cfg.BatchSize, QuarantineAfter: cfg.QuarantineAfter, Delete: cfg.Delete,
		FlushInterval: cfg.FlushInterval, PublishTimeout: cfg.PublishTimeout, RetryBackoff: cfg.RetryBackoff,
		MaxRetryBackoff: cfg.MaxRetryBackoff, QueryTimeout: cfg.QueryTimeout, StandbyPoll: min(time.Second, cfg.MaxRetryBackoff),
		ArchiveRetention: cfg.ArchiveRetention, ArchivePurgeInterval: cfg.ArchivePurgeInterval, DueInterval: cfg.DueInterval,
		ProgressInterval: cfg.ProgressInterval, Now: cfg.Now, Logger: log, Observer: cfg.Observer, OnQuarantine: cfg.OnQuarantine,
		Standby: "another process reads the slot; waiting to take over", TookOver: "took the slot over",
	})
	return &Relay{Relay: s.eng}, nil
}

// Close releases the pool once the relay stopped, and forgets the
// rows not published.
func (r *source) Close() {
	r.dropInitial()
	if r.pool != nil {
		r.pool.Close()
	}
}

// dropSlotWait is how long DropSlot waits for the server process of a
// relay that stopped.
const dropSlotWait = 3 * time.Second

// DropSlot drops the replication slot of a relay being retired, in the
// database of dbURL, so that the server stops keeping WAL for it. It fails
// while a relay reads the slot (stop it first; DropSlot waits 3s for a
// relay that just stopped), and with an error wrapping
// idem.ErrNotFound when there is no such slot. The publication stays (DROP
// PUBLICATION removes it).
func DropSlot(ctx context.Context, dbURL, slot string) error {
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return fmt.Errorf("idem: cdc: database URL: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("idem: cdc: connect: %w", err)
	}
	defer conn.Close(context.Background())
	// A managed server's errors name its own settings and roles.
	host := readSigns(ctx, conn).detect()
	// A relay that just stopped leaves its server process for a moment:
	// wait for it a little.
	deadline := time.Now().Add(dropSlotWait)
	for {
		_, err = conn.PgConn().ExecParams(ctx, dropSlotSQL, [][]byte{[]byte(slot)}, nil, nil, nil).Close()
		err = slotErrorOn(host, err, slot, cmp.Or(cfg.User, "the relay's user"))
		if !errors.Is(err, ErrSlotActive) || time.Now().After(deadline) || !ctxsleep.Sleep(ctx, 50*time.Millisecond) {
			return err
		}
	}
}
