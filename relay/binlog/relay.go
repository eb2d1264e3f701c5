package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/internal/periodic"
	"github.com/idem-go/idem/internal/startstop"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/internal/archivepurge"
	"github.com/idem-go/idem/relay/internal/sendspan"
)

// Relay publishes the inserts into a MariaDB outbox table, read from the
// server's binary log, through a broker.Publisher. Make one with New; Start
// and Stop it like the other relays.
//
// Delayed rows (idem.Event.NotBefore, a not_before column from migration
// 0012) are held: the stream skips their inserts and the stored position
// moves on; the rows wait in the table, where the relay that holds the
// outbox looks every Config.DueInterval for those due by Config.Now,
// publishes them, then deletes them (with KeepRows, sets their
// published_at). A crash before the delete leaves the row in the table for
// the next relay, and the first start's snapshot leaves delayed rows to the
// same scan. A delayed row holds back nothing of its aggregate.
type Relay struct {
	base startstop.Base
	cfg  Config
	log  *slog.Logger
	pub  broker.Publisher
	// tracing makes a producer span per published message.
	tracing sendspan.Tracer

	db   *sql.DB
	repl mysqlrepl.Config

	schema string // the outbox's database, resolved at Start
	sql    queries
	// idemTable is true when the outbox has idem's seq, published_at and
	// quarantined_at columns.
	idemTable bool
	// delayTable is true when it also has not_before (migration 0012):
	// delayed rows wait in it (due.go).
	delayTable bool

	// lock holds the outbox's named lock when Start took it.
	lock *sql.Conn

	ctx context.Context // the base's WorkContext
	wg  sync.WaitGroup

	stats stats
	errs  limiters
	// archiving is set when the relay archives what it publishes
	// (Config.ArchiveRetention); archiver purges the archive.
	archiving bool
	archiver  driver.OutboxArchiver
	archiveEx driver.Executor
	purge     periodic.Loop
	// names says where the relay reads the outbox's column names
	// (namesFromBinlog, namesFromSchema), logged when it changes.
	names atomic.Int32
	// resnapshot asks the next session to start from a snapshot of the
	// table, as at a first start: the rows at the stored position were
	// logged under columns the relay cannot name (ErrColumnsChanged).
	// Read and written by run's goroutine only.
	resnapshot bool
}

type limiters struct {
	replication, publish, visibility, store, purge *errlog.Limiter
}

type stats struct {
	published, calls, failures, txs, unreadable, deleted, quarantined atomic.Int64
	archived, purged                                                  atomic.Int64
	inFlight, lagBytes                                                atomic.Int64
	held, due                                                         atomic.Int64
	initialRows, initialDone                                          atomic.Int64
	oldest                                                            atomic.Int64 // unix nanos of the oldest unconfirmed commit
	streaming, waiting                                                atomic.Bool
	position                                                          atomic.Pointer[string]
	file                                                              atomic.Pointer[string]
	filePos                                                           atomic.Uint64
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
	// Unreadable counts the rows that could not become messages.
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
	// InFlight is the number of messages read and not yet confirmed.
	InFlight int64
	// InitialRows is the number of rows that waited in the outbox at the
	// first start (no stored position: the binlog after the snapshot's
	// position does not hold them, and the relay publishes them first),
	// and InitialDone how many of them the broker confirmed or that were
	// quarantined so far; both 0 when none waited. The relay logs how far
	// it is every ProgressInterval.
	InitialRows, InitialDone int64
	// Position is the GTID position last stored: the binlog up to it is
	// published.
	Position string
	// File and FilePos are the binlog file and offset the relay read last.
	File    string
	FilePos uint64
	// LagBytes is the binlog written by the server after what the relay
	// read, as of the last check (every Heartbeat).
	LagBytes int64
	// Lag is the age of the oldest commit read and not yet confirmed; 0
	// when none waits.
	Lag time.Duration
	// Streaming is true while the relay reads the binlog; Waiting, while
	// another process holds the outbox's lock.
	Streaming, Waiting bool
	// LastError is the last error met, "" when none.
	LastError string
}

// New returns a Relay reading the outbox of cfg.Tables in the database of
// dbURL (a mysql:// URL, see driver/mysql.ParseURL, or a DSN of
// github.com/go-sql-driver/mysql) and publishing through pub. The same
// user, address and TLS settings (Config.TLS, else the URL's sslmode,
// sslrootcert, sslcert and sslkey, or its tls) serve the replication
// connection: it needs the REPLICATION SLAVE and REPLICATION CLIENT
// (BINLOG MONITOR) privileges, and mysql_native_password authentication.
func New(dbURL string, pub broker.Publisher, cfg Config) (*Relay, error) {
	if pub == nil {
		return nil, errors.New("idem: binlog: New: nil publisher")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var mc *gomysql.Config
	var err error
	if strings.Contains(dbURL, "://") {
		mc, err = mysql.ParseURL(dbURL)
	} else {
		mc, err = gomysql.ParseDSN(dbURL)
	}
	if err != nil {
		return nil, fmt.Errorf("idem: binlog: database URL: %w", err)
	}
	if cfg.TLS != nil {
		mc.TLS, mc.AllowFallbackToPlaintext = cfg.TLS.Clone(), false
		if host, _, err := net.SplitHostPort(mc.Addr); err == nil && mc.TLS.ServerName == "" {
			mc.TLS.ServerName = host
		}
	}
	if mc.AllowFallbackToPlaintext {
		return nil, errors.New("idem: binlog: database URL: tls=preferred falls back to plain text, which the relay does not do: ask for TLS (sslmode=verify-full&sslrootcert=ca.pem) or remove tls=")
	}
	if cfg.Tables.Schema == "" && mc.DBName == "" {
		return nil, errors.New("idem: binlog: database URL: name the database (mysql://user:pass@host:port/DB) or set Config.Tables.Schema")
	}
	db, err := mysql.OpenConfig(mc)
	if err != nil {
		return nil, fmt.Errorf("idem: binlog: database URL: %w", err)
	}
	log := cfg.Logger.With("relay", "binlog")
	l := func(what string) *errlog.Limiter { return errlog.New(log, what, errlog.Config{}) }
	r := &Relay{
		cfg: cfg, log: log, pub: pub, db: db, tracing: sendspan.New(TracerName, cfg.TracerProvider, cfg.Propagator, pub),
		repl: mysqlrepl.Config{Network: mc.Net, Addr: mc.Addr, User: mc.User, Password: mc.Passwd,
			ServerID: cfg.ServerID, Heartbeat: cfg.Heartbeat, DialTimeout: mc.Timeout, TLS: mc.TLS},
		schema: cfg.Tables.Schema,
		errs: limiters{replication: l("binlog replication"), publish: l("binlog relay publications"),
			visibility: l("binlog visibility checks"), store: l("binlog position updates"), purge: l("binlog purge of the archive")},
		archiving: cfg.ArchiveRetention > 0,
	}
	r.purge = periodic.Loop{Interval: cfg.ArchivePurgeInterval, Jitter: 0.1, Run: r.purgeArchive}
	if r.schema == "" {
		r.schema = mc.DBName
	}
	if r.repl.ServerID == 0 {
		r.cfg.ServerID = DefaultServerID(idem.Tables{Schema: r.schema, Outbox: cfg.Tables.Outbox})
		r.repl.ServerID = r.cfg.ServerID
	}
	r.ctx = r.base.WorkContext()
	return r, nil
}

// Start checks the server (binary log on, in row format with full rows,
// the privileges, the outbox and position tables) and starts
// reading the binlog in the background. ctx bounds the start-up only. When
// another process reads the same outbox, the relay waits and takes over
// when it stops or dies (Stats.Waiting): Start does not fail for that.
func (r *Relay) Start(ctx context.Context) error {
	if err := r.base.Starting(); err != nil {
		return err
	}
	setupCtx, cancel := r.base.StartContext(ctx)
	err := r.setup(setupCtx)
	cancel()
	if err != nil {
		_ = r.db.Close()
		r.base.StartFailed()
		if errors.Is(context.Cause(setupCtx), idem.ErrStopped) {
			return fmt.Errorf("idem: binlog: Stop was called during the start-up: %w", idem.ErrStopped)
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
		_ = r.db.Close()
		r.base.Finished()
	}()
	r.base.Running()
	return nil
}

// Stop stops reading, waits for the messages handed to the broker, deletes
// the published rows and stores the position, then returns. When ctx ends
// first, the publishing in progress is abandoned (those messages are
// published again by the next relay) and Stop returns ctx's error; Done is
// closed when everything has ended. Stop is idempotent, and safe before,
// during and after Start.
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
		InFlight:        r.stats.inFlight.Load(),
		InitialRows:     r.stats.initialRows.Load(),
		InitialDone:     r.stats.initialDone.Load(),
		FilePos:         r.stats.filePos.Load(),
		LagBytes:        r.stats.lagBytes.Load(),
		Streaming:       r.stats.streaming.Load(),
		Waiting:         r.stats.waiting.Load(),
	}
	if p := r.stats.position.Load(); p != nil {
		s.Position = *p
	}
	if f := r.stats.file.Load(); f != nil {
		s.File = *f
	}
	if o := r.stats.oldest.Load(); o != 0 {
		s.Lag = max(0, time.Since(time.Unix(0, o)))
	}
	if e := r.stats.lastErr.Load(); e != nil {
		s.LastError = (*e).Error()
	}
	return s
}

// CDCStats returns the relay's statistics as those of the PostgreSQL CDC
// relay, which relay/cdc/cdcmetrics exports (cdcmetrics.StatsFunc): the
// binlog written after what the relay read is SlotLagBytes.
func (r *Relay) CDCStats() cdc.Stats {
	s := r.Stats()
	return cdc.Stats{Published: s.Published, PublishCalls: s.PublishCalls, PublishFailures: s.PublishFailures,
		Transactions: s.Transactions, Unreadable: s.Unreadable, Quarantined: s.Quarantined, Deleted: s.Deleted,
		Archived: s.Archived, ArchivePurged: s.ArchivePurged, Delayed: s.Delayed, DuePublished: s.DuePublished,
		InFlight: s.InFlight, InitialRows: s.InitialRows, InitialDone: s.InitialDone, SlotLagBytes: s.LagBytes, Lag: s.Lag, Streaming: s.Streaming, Waiting: s.Waiting,
		LastError: s.LastError}
}

// ErrNotRunning is returned by Healthy for a relay that is not running.
var ErrNotRunning = errors.New("idem: binlog: relay not running")

// Healthy returns nil while the relay reads the binlog, or waits for the
// outbox held by another process (a standby); otherwise ErrNotRunning or
// the error that keeps it from reading.
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
	return errors.New("idem: binlog: connecting to the server")
}

func (r *Relay) setErr(err error) {
	if err == nil {
		r.stats.lastErr.Store(nil)
		return
	}
	r.stats.lastErr.Store(&err)
}

// backoff returns the n-th delay (n >= 1): RetryBackoff doubling up to
// MaxRetryBackoff, with equal jitter.
func (r *Relay) backoff(n int) time.Duration {
	return backoff.Exponential(r.cfg.RetryBackoff, r.cfg.MaxRetryBackoff, n)
}

// stopping reports whether Stop was called.
func (r *Relay) stopping() bool {
	select {
	case <-r.base.Stopping():
		return true
	default:
		return false
	}
}

// ResetPosition forgets the stored position of the binlog relay of the
// outbox tables.Outbox, in the database of dbURL: the next start publishes
// the rows waiting in the outbox, then reads the binlog from the server's
// current position ("idem cdc reset-position"). It is the way back after
// the server purged the binlog holding the stored position
// (ErrPositionPurged). Stop the relay first: a running relay stores its
// position again.
func ResetPosition(ctx context.Context, dbURL string, tables idem.Tables) error {
	tables = tables.WithDefaults()
	if err := tables.Validate(); err != nil {
		return fmt.Errorf("idem: binlog: %w", err)
	}
	db, err := mysql.Open(dbURL)
	if err != nil {
		return fmt.Errorf("idem: binlog: database URL: %w", err)
	}
	defer db.Close()
	table := mysql.QuoteIdent(tables.BinlogPosition)
	if tables.Schema != "" {
		table = mysql.QuoteIdent(tables.Schema) + "." + table
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM `+table+` WHERE outbox_table = ?`, tables.Outbox); err != nil {
		return fmt.Errorf("idem: binlog: forget the position: %w", err)
	}
	return nil
}

// purgeArchive deletes the events archived longer ago than
// Config.ArchiveRetention, a batch at a time, as the polling relay deletes
// its published rows after its Retention. A Stop ends it between batches.
func (r *Relay) purgeArchive(ctx context.Context) {
	archivepurge.Run(ctx, r.base.Stopping(), r.archiver, r.archiveEx, time.Now().Add(-r.cfg.ArchiveRetention), cdc.ArchivePurgeBatchSize,
		r.cfg.QueryTimeout, r.errs.purge, func(n int64) { r.stats.purged.Add(n) })
}
