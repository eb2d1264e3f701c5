package cdc

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/mutant"
	"github.com/idem-go/idem/relay/internal/ordered"
	"github.com/idem-go/idem/relay/internal/sendspan"
)

// entry is a message read from the log, or the end of a transaction with no
// message to publish.
type entry struct {
	msg    idem.Message
	hasMsg bool
	key    string // aggregate type and id
	id     string // the row's id, to delete it; "" for a WAL message
	wal    bool   // a WAL message, which has no row
	// xid is the transaction that wrote the entry's row or WAL message; 0
	// for the end of a transaction without messages, which is never
	// published.
	xid uint32
	// seq numbers the entries in log order, from 1 in a session.
	seq uint64
	// rec is what the message was made of, to quarantine it; out is the
	// message on its way to the broker (package ordered).
	rec *driver.OutboxRecord
	out *ordered.Entry
	// lsn, when not 0, is the end of the transaction this entry ends: the
	// position that may be confirmed once this entry and every one before
	// it are published.
	lsn    pglogrepl.LSN
	commit time.Time
	// read is when the relay read the transaction's commit; shown when it
	// was seen visible and handed to the publisher.
	read, shown time.Time
	state       uint8
	// archive is set once the broker confirmed the message, when the
	// relay archives what it publishes (Config.ArchiveRetention).
	archive bool
}

const (
	pending uint8 = iota // read, not published yet
	sent                 // published, parked, or without a message
)

// pipeline holds what a session read and has not confirmed, in log order,
// and hands it to the broker through the relays' ordered publisher (package
// ordered): several Publish calls at once, a window of messages in flight,
// never two messages of one aggregate at once, so that a message is sent
// only after the previous one of its aggregate was confirmed. A message the
// broker refuses is retried, and parked once refused
// Config.QuarantineAfter times; the later messages of its aggregate then go
// on (the log cannot wait behind it).
//
// Nothing is published before its transaction is visible to other
// sessions. The server sends a transaction once its commit is flushed to
// the WAL, a moment before the transaction ends for other sessions (longer
// when a synchronous standby must confirm it first): a consumer that reads
// the producer's database on the event would not find its rows yet. A
// goroutine (watch) asks the server, in one query for every transaction
// read since its last answer, which ones are visible, and lets the entries
// through in log order up to the first one that is not.
type pipeline struct {
	r   *Relay
	ctx context.Context // the session's: publishing stops with it
	pub *ordered.Publisher

	mu       sync.Mutex
	entries  []*entry // log order; the confirmed ones leave from the front
	first    int      // the first entry not handed to pub
	nextSeq  uint64   // the seq of the next entry added
	shown    uint64   // the entries whose seq is below are visible
	byOut    map[*ordered.Entry]*entry
	unsent   int // messages read and not confirmed by the broker
	progress chan struct{}
	added    chan struct{} // wakes watch
	wg       sync.WaitGroup
}

func newPipeline(ctx context.Context, r *Relay) *pipeline {
	p := &pipeline{
		r: r, ctx: ctx,
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
			err := r.park(ctx, e, out.Err)
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

// empty reports whether nothing waits for the broker or for confirmation.
func (p *pipeline) empty() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.entries) == 0
}

// add appends a committed transaction's entries (at least one).
func (p *pipeline) add(es []*entry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(es) == 1 && !es[0].hasMsg && len(p.entries) > 0 {
		// A transaction without events after another one without events:
		// move the latter's position.
		if last := p.entries[len(p.entries)-1]; !last.hasMsg {
			last.lsn = es[0].lsn
			return
		}
	}
	now := time.Now()
	for _, e := range es {
		e.read = now
		if e.hasMsg {
			p.unsent++
			e.out = &ordered.Entry{Key: e.key, Msg: e.msg}
			p.byOut[e.out] = e
		} else {
			e.state = sent
			e.xid = 0
		}
		e.seq = p.nextSeq
		p.nextSeq++
		p.entries = append(p.entries, e)
	}
	p.r.stats.inFlight.Store(int64(p.unsent))
	if p.r.stats.oldest.Load() == 0 {
		p.r.stats.oldest.Store(p.entries[0].commit.UnixNano())
	}
	select {
	case p.added <- struct{}{}:
	default:
	}
}

// watch lets entries through once their transactions are visible, until
// the session ends. Each round asks about every transaction read and not
// yet seen visible; while one is not, it asks again after a short wait.
func (p *pipeline) watch() {
	r := p.r
	failures := 0
	for {
		select {
		case <-p.added:
		case <-p.ctx.Done():
			return
		}
		for wait := visibleWaitMin; ; {
			xids, seqs, end := p.unseen()
			if end == 0 {
				break // nothing waits
			}
			shown := end
			if len(xids) > 0 && !(mutant.Enabled && mutant.On(mutant.CDCSkipVisibility)) {
				qctx, cancel := context.WithTimeout(p.ctx, r.cfg.QueryTimeout)
				n, err := r.firstInvisible(qctx, xids)
				cancel()
				if err != nil {
					if p.ctx.Err() != nil {
						return
					}
					failures++
					r.setErr(err)
					d := r.backoff(failures)
					r.errs.visibility.Warn(p.ctx, "checking that committed transactions are visible failed; their messages wait", err, "retry_in", d.Round(time.Millisecond))
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
				if n > 0 {
					shown = seqs[n-1]
				}
			}
			p.mu.Lock()
			p.shown = max(p.shown, shown)
			p.handLocked()
			p.mu.Unlock()
			if shown == end {
				break
			}
			// A transaction committed in the log has not ended for other
			// sessions yet: usually a matter of microseconds.
			r.stats.visibilityWaits.Add(1)
			if !ctxsleep.Sleep(p.ctx, wait) {
				return
			}
			wait = min(2*wait, visibleWaitMax)
		}
	}
}

// The waits of watch while a transaction is not visible yet: usually a
// matter of microseconds, so the first is short; a commit that waits for
// a synchronous standby may take long, so they grow, to a cap that keeps
// the delay after its end small and the checks to 200 a second.
const (
	visibleWaitMin = 100 * time.Microsecond
	visibleWaitMax = 5 * time.Millisecond
)

// unseen returns the transactions of the entries not yet seen visible, in
// log order, with the seq of each one's first entry, and the seq after the
// last entry (0 when every entry was seen visible).
func (p *pipeline) unseen() (xids []uint32, seqs []uint64, end uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown >= p.nextSeq {
		return nil, nil, 0
	}
	i := len(p.entries)
	for i > 0 && p.entries[i-1].seq >= p.shown {
		i--
	}
	for _, e := range p.entries[i:] {
		if e.xid != 0 && (len(xids) == 0 || xids[len(xids)-1] != e.xid) {
			xids = append(xids, e.xid)
			seqs = append(seqs, e.seq)
		}
	}
	return xids, seqs, p.nextSeq
}

// handLocked hands the entries seen visible to the publisher, in log
// order.
func (p *pipeline) handLocked() {
	var out []*ordered.Entry
	i := p.first
	now := time.Now()
	for ; i < len(p.entries) && p.entries[i].seq < p.shown; i++ {
		if e := p.entries[i]; e.state == pending {
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
	e.state = sent
	if out.Outcome == ordered.Quarantined {
		e.id = "" // the row stays, quarantined
	}
	e.archive = out.Outcome == ordered.Published && r.archiving
	p.unsent--
	r.stats.inFlight.Store(int64(p.unsent))
	p.mu.Unlock()
	if out.Outcome == ordered.Published {
		r.stats.published.Add(1)
		if r.cfg.Observer.CommitToPublish != nil {
			r.cfg.Observer.CommitToPublish(out.At.Sub(e.commit))
		}
		if r.cfg.Observer.Stages != nil {
			r.cfg.Observer.Stages(Stages{
				Receive: e.read.Sub(e.commit),
				Visible: e.shown.Sub(e.read),
				Queue:   out.Sent.Sub(e.shown),
				Confirm: out.At.Sub(out.Sent),
			})
		}
	}
	p.signal()
}

func (p *pipeline) signal() {
	select {
	case p.progress <- struct{}{}:
	default:
	}
}

// confirmed takes the entries published from the front, and returns the
// position they reach (0 when none ends a transaction), the ids of the rows
// to delete, the events to archive, in log order, and the commit times of
// the transactions they end.
func (p *pipeline) confirmed() (lsn pglogrepl.LSN, ids []string, archive []*driver.OutboxRecord, commits []time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Only whole transactions: the entries of one not entirely published
	// stay, and are deleted with its position.
	last := 0
	for i := 0; i < len(p.entries) && p.entries[i].state == sent; i++ {
		if p.entries[i].lsn != 0 {
			last = i + 1
		}
	}
	if last == 0 {
		return 0, nil, nil, nil
	}
	for _, e := range p.entries[:last] {
		if e.id != "" {
			ids = append(ids, e.id)
		}
		if e.archive {
			archive = append(archive, e.rec)
		}
		if e.lsn != 0 {
			lsn = e.lsn
			if e.hasMsg {
				commits = append(commits, e.commit)
			}
		}
	}
	p.entries = append(p.entries[:0:0], p.entries[last:]...)
	p.first = max(0, p.first-last)
	if len(p.entries) > 0 {
		p.r.stats.oldest.Store(p.entries[0].commit.UnixNano())
	} else {
		p.r.stats.oldest.Store(0)
	}
	return lsn, ids, archive, commits
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
