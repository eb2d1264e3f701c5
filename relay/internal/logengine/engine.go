// Package logengine is the one engine of the log relays, relay/cdc
// (PostgreSQL's logical replication) and relay/binlog (MariaDB's binary
// log): what they do alike, written once. An adapter gives it a Source,
// what its log does differently (reading it, the first start's snapshot,
// checking that a transaction is visible, making a position durable, the
// leader's hold on the log, and its SQL on the outbox); the engine does
// the rest:
//
//   - the shell: the lifecycle (internal/startstop), the standby loop while
//     another process holds the log, reconnections with backoff, Stats,
//     Healthy, the Observer;
//   - the pipeline (pipeline.go): committed transactions in log order, a
//     window of messages in flight, the visibility gate (G13), the ordered
//     publisher in Retry mode (relay/internal/ordered), and the confirmed
//     position: the published rows deleted (and archived) before the
//     position is made durable (session.go);
//   - the rows published from the table (rows.go): those waiting at the
//     first start, with their progress lines, and the delayed rows once
//     due;
//   - quarantine (rows that cannot become messages, messages the broker
//     refuses) and the archive's purge (relay/internal/archivepurge).
//
// relay/internal/logengine/logenginetest is the conformance suite every
// Source passes.
package logengine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/pausewatch"
	"github.com/idem-go/idem/internal/periodic"
	"github.com/idem-go/idem/internal/startstop"
	"github.com/idem-go/idem/relay/internal/archivepurge"
	"github.com/idem-go/idem/relay/internal/sendspan"
	"github.com/idem-go/idem/relay/logrelay"
)

// Config is the engine's part of a log relay's configuration, with the
// adapter's defaults applied.
type Config struct {
	// Name prefixes the errors ("idem: <Name>: ...") and names the
	// limiters of the logs ("<Name> replication").
	Name string
	// Publisher takes the messages; Tracing makes their spans.
	Publisher broker.Publisher
	Tracing   sendspan.Tracer

	Window, BatchSize int
	QuarantineAfter   int
	Delete            logrelay.DeleteMode
	FlushInterval     time.Duration
	PublishTimeout    time.Duration
	RetryBackoff      time.Duration
	MaxRetryBackoff   time.Duration
	QueryTimeout      time.Duration
	// StandbyPoll is how often a relay that waits for the log held by
	// another process tries again.
	StandbyPoll          time.Duration
	ArchiveRetention     time.Duration
	ArchivePurgeInterval time.Duration
	DueInterval          time.Duration
	ProgressInterval     time.Duration
	Now                  func() time.Time
	Logger               *slog.Logger
	Observer             logrelay.Observer
	// OnQuarantine is called with the notice of each row or message the
	// relay quarantines, in the quarantine's transaction; nil: none.
	OnQuarantine func(ctx context.Context, ex driver.Executor, n idem.FailureNotice) error

	// Standby is logged once when another process holds the log, and
	// TookOver when this relay takes it then.
	Standby, TookOver string
}

// Source is what an adapter gives the engine: one database's log, and its
// outbox table.
type Source interface {
	// Setup checks the server and the tables at Start; ctx bounds it.
	Setup(ctx context.Context) (Setup, error)
	// Lead takes the log for one session: it returns an error wrapping
	// ErrStandby while another process holds it, ErrAgain to be called
	// again at once.
	Lead(ctx context.Context) (Reader, error)
	// Monitor measures the log's lag until stopping is closed (a
	// goroutine of its own, from Start to Stop).
	Monitor(ctx context.Context, stopping <-chan struct{})
	// Close releases what Setup opened, once the relay has stopped.
	Close()
	Table
}

// Setup is what Source.Setup found.
type Setup struct {
	// Archiver and ArchiveEx purge the archive, when the relay archives
	// (Config.ArchiveRetention positive).
	Archiver  driver.OutboxArchiver
	ArchiveEx driver.Executor
	// Pauses and PauseEx read the operators' pause of the relay
	// (idem.PauseRelay, named PauseName, the outbox table's name without
	// its schema); nil when the database has no table for pauses (it was
	// not migrated with idem migrate): then the relay cannot be paused.
	Pauses    driver.Pauses
	PauseEx   driver.Executor
	PauseName string
	// Outbox is the outbox table's name, without its schema, for the
	// notices of quarantines.
	Outbox string
	// Delayed is true when the table holds delayed rows (a not_before
	// column, and idem's columns): the engine publishes the due ones
	// (Table.DueRows) while it holds the log.
	Delayed bool
}

// Table is the adapter's SQL on the outbox and its archive.
type Table interface {
	// Delete deletes the published rows of ids and archives recs (nil
	// when the relay does not archive) at once: both or neither. An
	// event the archive cannot hold is logged and left out of it.
	Delete(ctx context.Context, ids []string, recs []*driver.OutboxRecord) (deleted, archived int64, err error)
	// RowsDone deletes the table's rows recs (read by DueRows or an
	// Initial), published, or with KeepRows marks them published, and
	// archives them when archive is set, at once.
	RowsDone(ctx context.Context, recs []*driver.OutboxRecord, archive bool) (affected, archived int64, err error)
	// DueRows reads a page of the delayed rows due at now, in seq order.
	DueRows(ctx context.Context, now time.Time) ([]driver.OutboxRecord, error)
	// Quarantine sets aside, in place, a row that cannot become a
	// message; false when it cannot be (deleted since, or a table without
	// idem's columns: the engine logs it with its content). It fails only
	// when the database does.
	// With notify not nil, it quarantines in a transaction and calls
	// notify in it with its executor and the row's seq, before the
	// commit: an error of notify rolls the quarantine back.
	Quarantine(ctx context.Context, rec *driver.OutboxRecord, reason error, notify Notify) (bool, error)
	// Park quarantines a message the broker refused; false when the table
	// cannot hold it (no idem's columns: the engine logs it).
	// notify as for Quarantine, with the seq of the row quarantined or
	// written.
	Park(ctx context.Context, p Refused, notify Notify) (bool, error)
	// Gone reports whether a statement's error says that the server is
	// going away or the connection is lost: the session ends rather than
	// retry.
	Gone(err error) bool
}

// Notify tells of a quarantine in its transaction (Config.OnQuarantine):
// ex is the transaction's, seq the quarantined row's.
type Notify func(ctx context.Context, ex driver.Executor, seq int64) error

// Refused is a message the broker refused QuarantineAfter times.
type Refused struct {
	Rec *driver.OutboxRecord
	// Table is set for a row read from the table (waiting at the first
	// start, or delayed), rather than from the log.
	Table bool
	// WAL is set for a PostgreSQL WAL message: it has no row.
	WAL bool
	// Refusals counts the refusals, and Earlier those the row had before
	// this relay read it (its attempts column).
	Refusals, Earlier int
	Err               error
}

// Reader is one session's hold on the log, from Source.Lead.
type Reader interface {
	// Initial returns the rows waiting in the table that the log will
	// not send, to publish before it; nil when none.
	Initial() Initial
	// Start starts reading the log, once the initial rows are published.
	Start(ctx context.Context) error
	// Read reads the log until a committed transaction is read, the
	// log's server asks for a durable position (Read.Flush), until passes
	// or stopping is closed.
	Read(ctx context.Context, until time.Time, stopping <-chan struct{}) (Read, error)
	// FirstInvisible returns the position (from 1) of the first of marks
	// (Tx.Mark) whose transaction other sessions do not see yet, 0 when
	// they see them all. It may wait for them instead.
	FirstInvisible(ctx context.Context, marks []any) (int, error)
	// Confirm makes a position durable, or says why not yet (false).
	Confirm(ctx context.Context, c Confirm) (bool, error)
	// Close ends the session.
	Close()
}

// Read is what Reader.Read read.
type Read struct {
	// Tx is the transaction read, nil when none.
	Tx *Tx
	// Flush asks for the position to be made durable now, and confirmed
	// even when it did not move.
	Flush bool
}

// Tx is a committed transaction read from the log.
type Tx struct {
	// Rows are its messages, in log order; none for a transaction without
	// events, whose position moves on.
	Rows []Row
	// Pos is the position after it, opaque to the engine.
	Pos any
	// Commit is its commit time; zero when unknown.
	Commit time.Time
	// Mark is what Reader.FirstInvisible needs to tell whether it is
	// visible; nil when nothing needs waiting for.
	Mark any
	// Foreign marks a transaction without events written by another
	// session than the relay's (Confirm.Foreign).
	Foreign bool
	// Part marks the rows of a transaction read so far, not to its end
	// (Pos is nil): a committed transaction too large to hold whole, handed
	// on PartRows at a time, with its Commit and Mark, then ended by a Tx
	// with its Pos and the rest of its rows, if any. Its rows are
	// published, deleted and archived as they come; its position is
	// confirmed once it ends, and a restart before reads it again whole.
	Part bool
}

// PartRows is how many rows of one transaction a reader holds before it
// hands them on as a Tx.Part: a transaction of a million rows (a backfill,
// a data migration) goes through in the memory of a few windows.
const PartRows = 1000

// Row is a message of a transaction.
type Row struct {
	Rec *driver.OutboxRecord
	Msg idem.Message
	// Delete is the id of the row to delete once published; "" when the
	// row stays.
	Delete string
	// WAL marks a PostgreSQL WAL message, which has no row.
	WAL bool
	// Refusals are those counted before (the row's attempts).
	Refusals int
}

// Confirm is what Reader.Confirm makes durable.
type Confirm struct {
	// Pos is the end of the last transaction whose messages, and all
	// before, are published and whose rows are deleted; nil when none
	// since the last durable one.
	Pos any
	// Events is set when a transaction up to Pos held events, Foreign
	// when one without events was another session's.
	Events, Foreign bool
	// Idle is set when nothing read waits: no message in flight, no row
	// to delete.
	Idle bool
	// Force is set at a stop, and when the server asked (Read.Flush).
	Force bool
}

// Initial are the rows waiting in the table when the relay first reads
// the log, which the log will not send: published first, in seq order.
type Initial interface {
	// Count counts them, for the progress lines.
	Count(ctx context.Context) (int64, error)
	// Page reads the next page of them; none at the end.
	Page(ctx context.Context) ([]driver.OutboxRecord, error)
	// When says when they waited ("when the slot was created"), and Lost
	// what to do when their publishing stopped before the end ("" when
	// the next start publishes them).
	When() string
	Lost() string
	// Close releases what reading them holds. It holds no transaction
	// while they are published: one would keep the table's lock, and a
	// schema change waiting for it would stop the table's writers.
	Close()
}

// ErrStandby is wrapped by Source.Lead's error while another process
// holds the log: the relay waits (Stats.Waiting) and tries again every
// Config.StandbyPoll.
var ErrStandby = errors.New("idem: the log is held by another process")

// ErrAgain is returned by Source.Lead or Reader.Start to be called again at
// once (a slot created again).
var ErrAgain = errors.New("idem: lead again")

// Delay wraps a session's error to say how long the relay waits before
// the next one, and how to tell it.
type Delay struct {
	Err error
	// Wait replaces the backoff when positive.
	Wait time.Duration
	// Msg replaces the log line's message.
	Msg string
	// Said means the adapter logged it: it is neither logged again nor
	// shown in Stats.LastError.
	Said bool
}

func (d *Delay) Error() string { return d.Err.Error() }
func (d *Delay) Unwrap() error { return d.Err }

// Relay is a log relay: the engine over one Source.
type Relay struct {
	base startstop.Base
	cfg  Config
	src  Source
	log  *slog.Logger
	ctx  context.Context // the base's WorkContext
	wg   sync.WaitGroup

	setup Setup
	// pauses is the operator's pause of the relay, set at Start and read
	// by Stats and Healthy meanwhile; nil: the relay cannot be paused.
	pauses atomic.Pointer[pausewatch.Watch]
	purge  periodic.Loop
	errs   limiters
	// C holds the counters behind Stats; the adapter moves those only it
	// knows (Delayed, the log's position and lag).
	C Counters
}

// Counters are the figures behind Stats.
type Counters struct {
	Published, Calls, Failures, Txs, Unreadable, Deleted, Quarantined atomic.Int64
	Archived, Purged, VisibilityWaits, Delayed, Due                   atomic.Int64
	InitialRows, InitialDone, InFlight                                atomic.Int64
	LagBytes, Retained                                                atomic.Int64
	Oldest                                                            atomic.Int64 // unix nanos of the oldest unconfirmed commit, 0 when none
	ConfirmedLSN, FilePos                                             atomic.Uint64
	Position, File                                                    atomic.Pointer[string]
	Streaming, Waiting                                                atomic.Bool
	lastErr                                                           atomic.Pointer[error]
}

// limiters log the failures that repeat while a dependency is away once
// per cause and interval, then a recovered line (package errlog).
type limiters struct {
	replication, publish, visibility, delete, purge *errlog.Limiter
}

// New returns the relay of src.
func New(src Source, cfg Config) *Relay {
	l := func(what string) *errlog.Limiter { return errlog.New(cfg.Logger, cfg.Name+" "+what, errlog.Config{}) }
	r := &Relay{cfg: cfg, src: src, log: cfg.Logger,
		errs: limiters{replication: l("replication"), publish: l("publications"), visibility: l("visibility checks"),
			delete: l("deletion of published rows"), purge: l("purge of the archive")}}
	r.ctx = r.base.WorkContext()
	r.purge = periodic.Loop{Interval: cfg.ArchivePurgeInterval, Jitter: 0.1, Run: r.purgeArchive}
	return r
}

// Context is the relay's work context: cancelled when a Stop is
// abandoned.
func (r *Relay) Context() context.Context { return r.ctx }

// Stopping is closed when Stop is called.
func (r *Relay) Stopping() <-chan struct{} { return r.base.Stopping() }

// Archiving reports whether the relay archives what it publishes.
func (r *Relay) Archiving() bool { return r.cfg.ArchiveRetention > 0 }

// Start runs Source.Setup, then reads the log in the background until
// Stop. ctx bounds the start-up only.
func (r *Relay) Start(ctx context.Context) error {
	if err := r.base.Starting(); err != nil {
		return err
	}
	// A Stop during the start-up ends it.
	setupCtx, cancel := r.base.StartContext(ctx)
	s, err := r.src.Setup(setupCtx)
	cancel()
	if err != nil {
		r.src.Close()
		r.base.StartFailed()
		if errors.Is(context.Cause(setupCtx), idem.ErrStopped) {
			return fmt.Errorf("idem: %s: Stop was called during the start-up: %w", r.cfg.Name, idem.ErrStopped)
		}
		return err
	}
	r.setup = s
	if s.Pauses != nil {
		r.pauses.Store(pausewatch.New(idem.PauseRelay, s.PauseName, s.Pauses, s.PauseEx, pausewatch.Interval, r.cfg.Now, r.log))
	} else {
		r.log.Info("the database has no table of operators' pauses: this relay cannot be paused (idem pause --relay); run idem migrate to add it")
	}
	stopping := r.base.Stopping()
	r.wg.Add(2)
	go func() { defer r.wg.Done(); r.run() }()
	go func() { defer r.wg.Done(); r.src.Monitor(r.ctx, stopping) }()
	if r.Archiving() {
		_ = r.purge.Start()
	}
	go func() {
		r.wg.Wait()
		if r.Archiving() {
			_ = r.purge.Stop(context.Background())
		}
		r.src.Close()
		r.base.Finished()
	}()
	r.base.Running()
	return nil
}

// Stop stops reading, waits for the messages handed to the broker, deletes
// the published rows and makes the position durable, then returns. When
// ctx ends first, the publishing in progress is abandoned (those messages
// are published again by the next relay) and Stop returns ctx's error at
// once; Done is closed when everything has ended. Stop is idempotent, and
// safe before, during and after Start.
func (r *Relay) Stop(ctx context.Context) error { return r.base.Stop(ctx, nil, nil) }

// Done is closed when the relay has stopped.
func (r *Relay) Done() <-chan struct{} { return r.base.Done() }

// Stats returns a snapshot of the relay's counters.
func (r *Relay) Stats() logrelay.Stats {
	c := &r.C
	s := logrelay.Stats{
		Published:       c.Published.Load(),
		PublishCalls:    c.Calls.Load(),
		PublishFailures: c.Failures.Load(),
		Transactions:    c.Txs.Load(),
		Unreadable:      c.Unreadable.Load(),
		Quarantined:     c.Quarantined.Load(),
		Deleted:         c.Deleted.Load(),
		Archived:        c.Archived.Load(),
		ArchivePurged:   c.Purged.Load(),
		Delayed:         c.Delayed.Load(),
		DuePublished:    c.Due.Load(),
		InitialRows:     c.InitialRows.Load(),
		InitialDone:     c.InitialDone.Load(),
		VisibilityWaits: c.VisibilityWaits.Load(),
		InFlight:        c.InFlight.Load(),
		ConfirmedLSN:    c.ConfirmedLSN.Load(),
		FilePos:         c.FilePos.Load(),
		LagBytes:        c.LagBytes.Load(),
		RetainedBytes:   c.Retained.Load(),
		Streaming:       c.Streaming.Load(),
		Waiting:         c.Waiting.Load(),
	}
	if p := c.Position.Load(); p != nil {
		s.Position = *p
	}
	if f := c.File.Load(); f != nil {
		s.File = *f
	}
	if o := c.Oldest.Load(); o != 0 {
		s.Lag = max(0, time.Since(time.Unix(0, o)))
	}
	if e := c.lastErr.Load(); e != nil {
		s.LastError = (*e).Error()
	}
	if p, ok := r.pauses.Load().Last(); ok {
		s.Paused = &p
	}
	return s
}

// Healthy returns nil while the relay reads its log, waits for the log
// held by another process (a standby), or is paused by an operator;
// otherwise logrelay.ErrNotRunning
// or the error that keeps it from reading.
func (r *Relay) Healthy() error {
	if r.base.State() != startstop.Running {
		return logrelay.ErrNotRunning
	}
	if r.C.Streaming.Load() || r.C.Waiting.Load() {
		return nil
	}
	if _, paused := r.pauses.Load().Last(); paused {
		return nil
	}
	if e := r.C.lastErr.Load(); e != nil {
		return *e
	}
	return fmt.Errorf("idem: %s: connecting to the server", r.cfg.Name)
}

// SetErr records the last error met (nil: none).
func (r *Relay) SetErr(err error) {
	if err == nil {
		r.C.lastErr.Store(nil)
		return
	}
	r.C.lastErr.Store(&err)
}

// Backoff returns the n-th delay (n >= 1): RetryBackoff doubling up to
// MaxRetryBackoff, with jitter.
func (r *Relay) Backoff(n int) time.Duration {
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

// run reads the log until Stop, one session after another: it waits while
// another process holds the log, and reconnects after failures with
// capped backoff.
func (r *Relay) run() {
	failures := 0
	stopping := r.base.Stopping()
	for {
		// A relay paused by an operator does not take the log: its
		// position stays where it was confirmed, and a first start waits
		// to take the log's snapshot.
		if !r.waitUnpaused(r.ctx, stopping) || r.stopping() {
			return
		}
		read, err := r.session()
		if r.stopping() {
			return
		}
		if errors.Is(err, ErrAgain) {
			failures = 0
			continue
		}
		if read {
			failures = 0
		}
		var d time.Duration
		var delay *Delay
		switch {
		case errors.Is(err, ErrStandby):
			if !r.C.Waiting.Swap(true) {
				r.log.Info(r.cfg.Standby, "error", err)
			}
			d = backoff.Jitter(r.cfg.StandbyPoll, 0.2)
		case errors.As(err, &delay) && delay.Said:
			failures++
			d = cmpDuration(delay.Wait, r.Backoff(failures))
		default:
			failures++
			r.C.Waiting.Store(false)
			r.SetErr(err)
			d = r.Backoff(failures)
			msg := "replication stopped; reconnecting"
			if delay != nil {
				d = cmpDuration(delay.Wait, d)
				if delay.Msg != "" {
					msg = delay.Msg
				}
			}
			r.errs.replication.Warn(r.ctx, msg, err, "retry_in", d.Round(time.Millisecond))
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-stopping:
			t.Stop()
			return
		}
	}
}

func cmpDuration(d, or time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return or
}

// purgeArchive deletes the events archived longer ago than
// Config.ArchiveRetention, a batch at a time, as the polling relay deletes
// its published rows after its Retention. A Stop ends it between batches.
func (r *Relay) purgeArchive(ctx context.Context) {
	archivepurge.Run(ctx, r.base.Stopping(), r.setup.Archiver, r.setup.ArchiveEx, time.Now().Add(-r.cfg.ArchiveRetention),
		logrelay.ArchivePurgeBatchSize, r.cfg.QueryTimeout, r.errs.purge, func(n int64) { r.C.Purged.Add(n) })
}

// waitUnpaused returns at once while no operator's pause holds the relay,
// else when it ends; false when ctx ends or stop is closed first.
func (r *Relay) waitUnpaused(ctx context.Context, stop <-chan struct{}) bool {
	w := r.pauses.Load()
	for w != nil {
		_, wait, paused := w.Check(ctx)
		if !paused {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		case <-stop:
			t.Stop()
			return false
		}
	}
	return true
}

// paused reports whether an operator's pause holds the relay now.
func (r *Relay) paused(ctx context.Context) bool {
	_, _, paused := r.pauses.Load().Check(ctx)
	return paused
}
