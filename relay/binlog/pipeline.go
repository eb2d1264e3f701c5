package binlog

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/mutant"
	"github.com/idem-go/idem/internal/progress"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/internal/ordered"
	"github.com/idem-go/idem/relay/internal/sendspan"
)

// entry is a message read from the binlog (or from the rows waiting at the
// first start), or the end of a transaction with no message to publish.
type entry struct {
	msg    idem.Message
	hasMsg bool
	key    string // aggregate type and id
	// id is the row's id, to delete it once published; "" when the row
	// stays.
	id string
	// lockID is, on the first entry of a transaction, the id of one of its
	// rows: a locking read of it waits for the transaction's commit
	// (visibility). "" when nothing needs waiting for.
	lockID string
	rec    *driver.OutboxRecord
	out    *ordered.Entry
	seq    uint64
	// pos, when not "", is the GTID position after the transaction this
	// entry ends: stored once this entry and every one before it are
	// published. file and filePos locate it in the binlog.
	pos     string
	file    string
	filePos uint64
	commit  time.Time
	// read is when the relay read the transaction's end; shown when it was
	// seen committed and handed to the publisher.
	read, shown time.Time
	sent        bool // published, parked, or without a message
	// foreign marks the end of a transaction without events that was not
	// the relay's own write of its position: moving past it is worth
	// storing (the next start reads less), though not at once.
	foreign bool
	// store marks a position to store at once: the first start's.
	store bool
	// archive is set once the broker confirmed the message, when the
	// relay archives what it publishes (Config.ArchiveRetention).
	archive bool
	// initial marks a row that waited in the outbox at the first start:
	// its settling counts in Stats.InitialDone.
	initial bool
}

// pipeline holds what a session read and has not stored, in binlog order,
// and hands it to the broker through the relays' ordered publisher: several
// Publish calls at once, never two messages of one aggregate at once. A
// message the broker refuses is retried, and parked once refused
// Config.QuarantineAfter times.
//
// Nothing is published before its transaction is visible to other
// sessions: the server writes a transaction to its binlog, and sends it to
// replicas, a moment before the storage engine commits it. A goroutine
// (watch) reads one row of every transaction read since its last round
// with a locking read, which waits for those transactions to commit, and
// then lets their entries through.
type pipeline struct {
	r   *Relay
	ctx context.Context
	pub *ordered.Publisher
	vis *sql.Conn // READ COMMITTED, for the locking reads

	mu       sync.Mutex
	entries  []*entry
	first    int    // the first entry not handed to pub
	nextSeq  uint64 // seq of the next entry added
	shown    uint64 // entries whose seq is below are visible
	byOut    map[*ordered.Entry]*entry
	unsent   int
	progress chan struct{}
	added    chan struct{}
	wg       sync.WaitGroup

	// initial reports the publishing of the rows waiting at the first
	// start (nil otherwise); initialMu orders its end.
	initialMu          sync.Mutex
	initial            *progress.Reporter
	initialQuarantined int64
}

func newPipeline(ctx context.Context, r *Relay, vis *sql.Conn) *pipeline {
	p := &pipeline{
		r: r, ctx: ctx, vis: vis,
		nextSeq:  1,
		shown:    1,
		byOut:    map[*ordered.Entry]*entry{},
		progress: make(chan struct{}, 1),
		added:    make(chan struct{}, 1),
	}
	p.pub = ordered.New(ctx, ordered.Config{
		Publish: func(ctx context.Context, batch []*ordered.Entry, msgs []idem.Message) error {
			start := time.Now()
			spans := r.tracing.Start(ctx, msgs, func(j int) (int64, int) { return 0, batch[j].Refusals + 1 })
			err := r.pub.Publish(ctx, msgs)
			sendspan.End(spans, err)
			r.stats.calls.Add(1)
			if r.cfg.Observer.Publish != nil {
				r.cfg.Observer.Publish(len(msgs), time.Since(start), err)
			}
			return err
		},
		Calls:           max(2, min(8, (r.cfg.Window+r.cfg.BatchSize-1)/r.cfg.BatchSize)),
		MinCall:         r.cfg.BatchSize,
		MaxCall:         r.cfg.BatchSize,
		Timeout:         r.cfg.PublishTimeout,
		QuarantineAfter: r.cfg.QuarantineAfter,
		Mode:            ordered.Retry,
		Backoff:         r.backoff,
		Park: func(ctx context.Context, out *ordered.Entry) error {
			p.mu.Lock()
			e := p.byOut[out]
			p.mu.Unlock()
			err := r.park(ctx, e.rec, out.Refusals, out.Err)
			if err != nil && ctx.Err() == nil {
				r.log.Warn("quarantining a message the broker refused failed; publishing it again", "error", err)
			}
			return err
		},
		Settled:  p.settled,
		Answered: func(int) { r.errs.publish.OK(p.ctx); r.setErr(nil) },
		Failed: func(n, failures int, err error, wait time.Duration) {
			r.stats.failures.Add(1)
			r.setErr(err)
			r.errs.publish.Warn(p.ctx, "publish failed; retrying the same messages before their aggregates go on", err,
				"messages", n, "attempt", failures, "retry_in", wait.Round(time.Millisecond))
		},
	})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.watch()
	}()
	return p
}

// full reports whether the window is full: the reader waits.
func (p *pipeline) full() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unsent >= p.r.cfg.Window
}

// add appends a transaction's entries (at least one), in binlog order.
func (p *pipeline) add(es []*entry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(es) == 1 && !es[0].hasMsg && len(p.entries) > 0 {
		// A transaction without events after another one without events:
		// move the latter's position.
		if last := p.entries[len(p.entries)-1]; !last.hasMsg && !last.store && last.lockID == "" && last.pos != "" {
			last.pos, last.file, last.filePos = es[0].pos, es[0].file, es[0].filePos
			last.foreign = last.foreign || es[0].foreign
			return
		}
	}
	now := time.Now()
	for _, e := range es {
		e.read = now
		if e.hasMsg {
			p.unsent++
			e.out = &ordered.Entry{Key: e.key, Msg: e.msg, Refusals: e.rec.Attempts}
			p.byOut[e.out] = e
		} else {
			e.sent = true
		}
		e.seq = p.nextSeq
		p.nextSeq++
		p.entries = append(p.entries, e)
	}
	p.r.stats.inFlight.Store(int64(p.unsent))
	if p.r.stats.oldest.Load() == 0 && !p.entries[0].commit.IsZero() {
		p.r.stats.oldest.Store(p.entries[0].commit.UnixNano())
	}
	select {
	case p.added <- struct{}{}:
	default:
	}
}

// watch lets entries through once their transactions are committed, until
// the session ends.
func (p *pipeline) watch() {
	r := p.r
	failures := 0
	for {
		select {
		case <-p.added:
		case <-p.ctx.Done():
			return
		}
		for {
			ids, end := p.unseen()
			if end == 0 {
				break
			}
			if len(ids) > 0 && !(mutant.Enabled && mutant.On(mutant.CDCSkipVisibility)) {
				err := r.waitCommitted(p.ctx, p.vis, ids)
				if err != nil {
					if p.ctx.Err() != nil {
						return
					}
					failures++
					r.setErr(err)
					d := r.backoff(failures)
					r.errs.visibility.Warn(p.ctx, "waiting for the commit of transactions read from the binlog failed; their messages wait", err, "retry_in", d.Round(time.Millisecond))
					if !ctxsleep.Sleep(p.ctx, d) {
						return
					}
					continue
				}
				if failures > 0 {
					failures = 0
					r.setErr(nil)
				}
				r.errs.visibility.OK(p.ctx)
			}
			p.mu.Lock()
			p.shown = max(p.shown, end)
			p.handLocked()
			p.mu.Unlock()
		}
	}
}

// waitCommitted returns once the transactions that wrote the rows of ids
// are committed: a locking read waits for the writer's row locks, which
// the server holds until the storage engine committed (after the binlog
// was written). The session is READ COMMITTED: no gap locks, and a row its
// writer deleted in the same transaction is skipped once committed.
func (r *Relay) waitCommitted(ctx context.Context, conn *sql.Conn, ids []string) error {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	var n int
	return conn.QueryRowContext(qctx, `SELECT COUNT(*) FROM `+r.sql.table+` WHERE id IN (`+placeholders(len(ids))+`) LOCK IN SHARE MODE`, args...).Scan(&n)
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

// unseen returns the lock ids of the transactions not yet seen committed,
// and the seq after the last entry (0 when every entry was seen).
func (p *pipeline) unseen() (ids []string, end uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown >= p.nextSeq {
		return nil, 0
	}
	i := len(p.entries)
	for i > 0 && p.entries[i-1].seq >= p.shown {
		i--
	}
	for _, e := range p.entries[i:] {
		if e.lockID != "" {
			ids = append(ids, e.lockID)
		}
	}
	return ids, p.nextSeq
}

// handLocked hands the entries seen committed to the publisher.
func (p *pipeline) handLocked() {
	var out []*ordered.Entry
	i := p.first
	now := time.Now()
	for ; i < len(p.entries) && p.entries[i].seq < p.shown; i++ {
		if e := p.entries[i]; !e.sent {
			e.shown = now
			out = append(out, e.out)
		}
	}
	p.first = i
	if len(out) > 0 {
		p.pub.Add(out...)
	}
}

// settled records an entry the broker confirmed or that was parked.
func (p *pipeline) settled(out *ordered.Entry) {
	r := p.r
	p.mu.Lock()
	e := p.byOut[out]
	delete(p.byOut, out)
	e.sent = true
	if out.Outcome == ordered.Quarantined {
		e.id = "" // the row stays, quarantined
	}
	e.archive = out.Outcome == ordered.Published && r.archiving
	p.unsent--
	r.stats.inFlight.Store(int64(p.unsent))
	p.mu.Unlock()
	if e.initial {
		p.initialSettled(out.Outcome == ordered.Quarantined)
	}
	if out.Outcome == ordered.Published {
		r.stats.published.Add(1)
		if !e.commit.IsZero() {
			if r.cfg.Observer.CommitToPublish != nil {
				r.cfg.Observer.CommitToPublish(out.At.Sub(e.commit))
			}
			if r.cfg.Observer.Stages != nil {
				r.cfg.Observer.Stages(cdc.Stages{
					Receive: e.read.Sub(e.commit),
					Visible: e.shown.Sub(e.read),
					Queue:   out.Sent.Sub(e.shown),
					Confirm: out.At.Sub(out.Sent),
				})
			}
		}
	}
	select {
	case p.progress <- struct{}{}:
	default:
	}
}

// startInitial starts the report of the rows waiting at the first start,
// total of them (0 when unknown until they are read).
func (p *pipeline) startInitial(total int64) {
	p.initialMu.Lock()
	defer p.initialMu.Unlock()
	p.r.stats.initialRows.Store(total)
	p.r.stats.initialDone.Store(0)
	p.initial = progress.New(progress.Config{Name: "initial rows", Unit: "rows", Total: total, Logger: p.r.log, Interval: p.r.cfg.ProgressInterval,
		Running:  "publishing the rows waiting in the outbox at the first start",
		Finished: "published the rows waiting in the outbox at the first start"})
}

// initialSettled counts a row waiting at the first start that the broker
// confirmed or that was quarantined (unreadable, or refused), and ends
// the report with the last one.
func (p *pipeline) initialSettled(quarantined bool) {
	p.initialMu.Lock()
	defer p.initialMu.Unlock()
	if quarantined {
		p.initialQuarantined++
	}
	p.initial.Add(1)
	p.r.stats.initialDone.Add(1)
	p.endInitialLocked()
}

// initialRead sets the total of the rows waiting at the first start once
// they are all read (the count before them may have failed).
func (p *pipeline) initialRead(n int64) {
	p.initialMu.Lock()
	defer p.initialMu.Unlock()
	p.r.stats.initialRows.Store(n)
	p.initial.SetTotal(n)
	p.endInitialLocked()
}

// endInitialLocked ends the report once every row waiting at the first
// start is settled.
func (p *pipeline) endInitialLocked() {
	done := p.r.stats.initialDone.Load()
	if done > 0 && done == p.r.stats.initialRows.Load() {
		p.initial.Finish(progress.Count{Name: "published", N: done - p.initialQuarantined}, progress.Count{Name: "quarantined", N: p.initialQuarantined})
	}
}

// confirmed takes the published entries from the front, whole transactions
// only, and returns the position they reach (nil when none ends a
// transaction), the ids of the rows to delete, the commit times of the
// transactions they end, the events to archive, in binlog order, and whether
// any of those held events (events) or was another session's transaction
// without events (foreign).
func (p *pipeline) confirmed() (end *entry, ids []string, archive []*driver.OutboxRecord, commits []time.Time, events, foreign bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := 0
	for i := 0; i < len(p.entries) && p.entries[i].sent && p.entries[i].seq < p.shown; i++ {
		if p.entries[i].pos != "" {
			last = i + 1
		}
	}
	if last == 0 {
		return nil, nil, nil, nil, false, false
	}
	for _, e := range p.entries[:last] {
		if e.id != "" {
			ids = append(ids, e.id)
		}
		if e.archive {
			archive = append(archive, e.rec)
		}
		events = events || e.hasMsg || e.store
		foreign = foreign || e.foreign
		if e.pos != "" {
			end = e
			if !e.commit.IsZero() {
				commits = append(commits, e.commit)
			}
		}
	}
	p.entries = append(p.entries[:0:0], p.entries[last:]...)
	p.first = max(0, p.first-last)
	p.r.stats.oldest.Store(0)
	for _, e := range p.entries {
		if !e.commit.IsZero() {
			p.r.stats.oldest.Store(e.commit.UnixNano())
			break
		}
	}
	return end, ids, archive, commits, events, foreign
}

// drainWait waits until the broker confirmed every message read, and
// reports whether it did before ctx ended.
func (p *pipeline) drainWait(ctx context.Context) bool {
	for {
		p.mu.Lock()
		n := p.unsent
		p.mu.Unlock()
		if n == 0 {
			return true
		}
		select {
		case <-p.progress:
		case <-ctx.Done():
			return false
		}
	}
}

// wait waits for the publishing in progress to end.
func (p *pipeline) wait() {
	p.wg.Wait()
	p.pub.Wait()
}
