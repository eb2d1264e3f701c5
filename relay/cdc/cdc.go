package cdc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/periodic"
	"github.com/idem-go/idem/internal/startstop"
	"github.com/idem-go/idem/relay/internal/archivepurge"
	"github.com/idem-go/idem/relay/internal/sendspan"
)

// Relay publishes the outbox's inserts and the outbox's WAL messages, read
// from a logical replication slot, through a broker.Publisher. Make one with
// New; Start and Stop it like the polling relay. Delayed rows wait in the
// table and are published from it once due (see the package
// documentation).
type Relay struct {
	base startstop.Base
	cfg  Config
	log  *slog.Logger
	pub  broker.Publisher
	// tracing makes a producer span per published message.
	tracing sendspan.Tracer

	dbURL   string
	replCfg *pgconn.Config

	pool   *pgxpool.Pool
	host   managedServer // the service running the server, for the hints of start-up errors (managed.go)
	schema string        // the outbox's schema, resolved at Start
	sql    queries

	ctx context.Context // the base's WorkContext: cancelled by an abandoned Stop
	wg  sync.WaitGroup

	stats stats
	errs  limiters

	// warnedRowsOnly is set once a WAL message was read with
	// Config.RowsOnly (warned once).
	warnedRowsOnly atomic.Bool

	// archiving is set when the relay archives what it publishes
	// (Config.ArchiveRetention); archiver and archiveEx purge the archive.
	archiving bool
	archiver  driver.OutboxArchiver
	archiveEx driver.Executor
	purge     periodic.Loop

	// initial holds, from the creation of the slot until the reading
	// goroutine published them, the rows that were waiting in the outbox
	// then (sweep.go).
	initial *initialRows
}

// limiters log the failures that repeat while a dependency is away once
// per cause and interval, then a recovered line (package errlog).
type limiters struct {
	replication, publish, visibility, delete, purge *errlog.Limiter
}

func newLimiters(log *slog.Logger) limiters {
	l := func(what string) *errlog.Limiter { return errlog.New(log, what, errlog.Config{}) }
	return limiters{
		replication: l("CDC replication"),
		publish:     l("CDC publications"),
		visibility:  l("CDC visibility checks"),
		delete:      l("CDC deletion of published rows"),
		purge:       l("CDC purge of the archive"),
	}
}

// stats are the counters behind Stats.
type stats struct {
	published, calls, failures, txs, unreadable, deleted, quarantined atomic.Int64
	archived, purged                                                  atomic.Int64
	visibilityWaits                                                   atomic.Int64
	held, due                                                         atomic.Int64
	initialRows, initialDone                                          atomic.Int64
	inFlight                                                          atomic.Int64
	confirmed                                                         atomic.Uint64
	lagBytes, retained                                                atomic.Int64
	oldest                                                            atomic.Int64 // unix nanos of the oldest unconfirmed commit, 0 when none
	streaming, waiting                                                atomic.Bool
	lastErr                                                           atomic.Pointer[error]
}

// Stats is a snapshot of a relay's counters.
type Stats struct {
	// Published counts the messages the broker confirmed.
	Published int64
	// PublishCalls and PublishFailures count the Publish calls, and those
	// that failed (whole or in part; each is retried).
	PublishCalls, PublishFailures int64
	// Transactions counts the committed transactions read that held
	// outbox events.
	Transactions int64
	// Unreadable counts the rows and WAL messages that could not become
	// messages (quarantined rows included).
	Unreadable int64
	// Quarantined counts the rows quarantined in the outbox table.
	Quarantined int64
	// Deleted counts the published rows deleted.
	Deleted int64
	// Archived counts the events written into the archive
	// (Config.ArchiveRetention), and ArchivePurged those deleted from it
	// after the retention.
	Archived, ArchivePurged int64
	// Delayed counts the inserts of delayed rows (idem.Event.NotBefore)
	// the stream left in the table to wait for their time, and
	// DuePublished the delayed rows published from the table once due.
	Delayed, DuePublished int64
	// InitialRows is the number of rows that waited in the outbox when the
	// slot was created (the stream does not send them: the relay publishes
	// them first, from the slot's snapshot), and InitialDone how many of
	// them are published or quarantined so far; both 0 when none waited.
	// The relay logs how far it is every ProgressInterval.
	InitialRows, InitialDone int64
	// VisibilityWaits counts the checks that found a transaction the log
	// sent as committed not yet visible to other sessions: its messages,
	// and those after it, waited (nothing is published before its
	// transaction is visible).
	VisibilityWaits int64
	// InFlight is the number of messages read and not yet confirmed.
	InFlight int64
	// ConfirmedLSN is the position last confirmed to the server.
	ConfirmedLSN uint64
	// SlotLagBytes is the WAL between the server's current position and the
	// slot's confirmed position; RetainedBytes, the WAL the slot keeps
	// (from its restart position). Both as of the last check (every
	// StandbyInterval).
	SlotLagBytes, RetainedBytes int64
	// Lag is the age of the oldest commit read and not yet confirmed; 0
	// when none waits.
	Lag time.Duration
	// Streaming is true while the relay reads the slot; Waiting, while
	// another process holds it.
	Streaming, Waiting bool
	// LastError is the last error met, "" when none.
	LastError string
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
	r := &Relay{cfg: cfg, log: log, errs: newLimiters(log), pub: pub, dbURL: dbURL, replCfg: rc, archiving: cfg.ArchiveRetention > 0,
		tracing: sendspan.New(TracerName, cfg.TracerProvider, cfg.Propagator, pub)}
	r.ctx = r.base.WorkContext()
	r.purge = periodic.Loop{Interval: cfg.ArchivePurgeInterval, Jitter: 0.1, Run: r.purgeArchive}
	return r, nil
}

// Start checks the server (wal_level=logical, the outbox table, the
// REPLICATION privilege), creates the publication and the slot when they do
// not exist, and starts reading the slot in the background. ctx bounds the
// start-up only. When another process holds the slot, the relay waits and
// takes over when it is released (Stats.Waiting): Start does not fail for
// that.
func (r *Relay) Start(ctx context.Context) error {
	if err := r.base.Starting(); err != nil {
		return err
	}
	// A Stop during the start-up ends it.
	setupCtx, cancel := r.base.StartContext(ctx)
	err := r.setup(setupCtx)
	cancel()
	if err != nil {
		r.dropInitial()
		if r.pool != nil {
			r.pool.Close()
		}
		r.base.StartFailed()
		if errors.Is(context.Cause(setupCtx), idem.ErrStopped) {
			return fmt.Errorf("idem: cdc: Stop was called during the start-up: %w", idem.ErrStopped)
		}
		return err
	}
	r.wg.Add(2)
	go func() { defer r.wg.Done(); r.run() }()
	go func() { defer r.wg.Done(); r.monitor() }()
	if r.archiving {
		_ = r.purge.Start()
	}
	go func() {
		r.wg.Wait()
		if r.archiving {
			_ = r.purge.Stop(context.Background())
		}
		r.pool.Close()
		r.base.Finished()
	}()
	r.base.Running()
	return nil
}

// Stop stops reading, waits for the messages handed to the broker, deletes
// the published rows and confirms the position to the server, then
// returns. When ctx ends first, the publishing in progress is abandoned
// (those messages are published again by the next relay on the slot) and
// Stop returns ctx's error at once; Done is closed when everything has
// ended. Stop is idempotent, and safe before, during and after Start.
func (r *Relay) Stop(ctx context.Context) error {
	return r.base.Stop(ctx, nil, nil)
}

// Done is closed when the relay has stopped.
func (r *Relay) Done() <-chan struct{} { return r.base.Done() }

// Stats returns a snapshot of the relay's counters.
func (r *Relay) Stats() Stats {
	s := Stats{
		Published:       r.stats.published.Load(),
		PublishCalls:    r.stats.calls.Load(),
		PublishFailures: r.stats.failures.Load(),
		Transactions:    r.stats.txs.Load(),
		Unreadable:      r.stats.unreadable.Load(),
		Quarantined:     r.stats.quarantined.Load(),
		Deleted:         r.stats.deleted.Load(),
		Archived:        r.stats.archived.Load(),
		ArchivePurged:   r.stats.purged.Load(),
		Delayed:         r.stats.held.Load(),
		DuePublished:    r.stats.due.Load(),
		InitialRows:     r.stats.initialRows.Load(),
		InitialDone:     r.stats.initialDone.Load(),
		VisibilityWaits: r.stats.visibilityWaits.Load(),
		InFlight:        r.stats.inFlight.Load(),
		ConfirmedLSN:    r.stats.confirmed.Load(),
		SlotLagBytes:    r.stats.lagBytes.Load(),
		RetainedBytes:   r.stats.retained.Load(),
		Streaming:       r.stats.streaming.Load(),
		Waiting:         r.stats.waiting.Load(),
	}
	if o := r.stats.oldest.Load(); o != 0 {
		s.Lag = max(0, time.Since(time.Unix(0, o)))
	}
	if e := r.stats.lastErr.Load(); e != nil {
		s.LastError = (*e).Error()
	}
	return s
}

// ErrNotRunning is returned by Healthy for a relay that is not running.
var ErrNotRunning = errors.New("idem: cdc: relay not running")

// Healthy returns nil while the relay reads its slot, or waits for the slot
// held by another process (a standby); otherwise ErrNotRunning or the error
// that keeps it from reading.
func (r *Relay) Healthy() error {
	if r.base.State() != startstop.Running {
		return ErrNotRunning
	}
	if r.stats.streaming.Load() || r.stats.waiting.Load() {
		return nil
	}
	if e := r.stats.lastErr.Load(); e != nil {
		return *e
	}
	return errors.New("idem: cdc: connecting to the slot")
}

func (r *Relay) setErr(err error) {
	if err == nil {
		r.stats.lastErr.Store(nil)
		return
	}
	r.stats.lastErr.Store(&err)
}

// backoff returns the n-th delay (n >= 1) from RetryBackoff doubling up to
// MaxRetryBackoff, with ±20% jitter.
func (r *Relay) backoff(n int) time.Duration {
	d := r.cfg.RetryBackoff
	for i := 1; i < n && d < r.cfg.MaxRetryBackoff; i++ {
		d *= 2
	}
	d = min(d, r.cfg.MaxRetryBackoff)
	return jitter(d)
}

// jitter returns d changed by a random fraction in [-20%, +20%].
func jitter(d time.Duration) time.Duration { return backoff.Jitter(d, 0.2) }

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
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		return fmt.Errorf("idem: cdc: database URL: %w", err)
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("idem: cdc: connect: %w", err)
	}
	defer conn.Close(context.Background())
	// A relay that just stopped leaves its server process for a moment:
	// wait for it a little.
	deadline := time.Now().Add(dropSlotWait)
	for {
		_, err = conn.ExecParams(ctx, dropSlotSQL, [][]byte{[]byte(slot)}, nil, nil, nil).Close()
		err = slotError(err, slot, cmp.Or(cfg.User, "the relay's user"))
		if !errors.Is(err, ErrSlotActive) || time.Now().After(deadline) || !ctxsleep.Sleep(ctx, 50*time.Millisecond) {
			return err
		}
	}
}

// purgeArchive deletes the events archived longer ago than
// Config.ArchiveRetention, a batch at a time, as the polling relay deletes
// its published rows after its Retention. A Stop ends it between batches.
func (r *Relay) purgeArchive(ctx context.Context) {
	archivepurge.Run(ctx, r.base.Stopping(), r.archiver, r.archiveEx, time.Now().Add(-r.cfg.ArchiveRetention), ArchivePurgeBatchSize,
		r.cfg.QueryTimeout, r.errs.purge, func(n int64) { r.stats.purged.Add(n) })
}
