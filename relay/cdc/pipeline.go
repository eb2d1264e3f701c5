package cdc

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/ctxsleep"
)

// entry is a message read from the log, or the end of a transaction with no
// message to publish.
type entry struct {
	msg    idem.Message
	hasMsg bool
	key    string // aggregate type and id
	id     string // the row's id, to delete it; "" for a WAL message
	// xid is the transaction that wrote the entry's row or WAL message; 0
	// for the end of a transaction without messages, which is never
	// published.
	xid uint32
	// seq numbers the entries in log order, from 1 in a session.
	seq uint64
	// rec is what the message was made of, to quarantine it; refusals
	// counts the attempts the broker refused it on.
	rec      *driver.OutboxRecord
	refusals int
	// lsn, when not 0, is the end of the transaction this entry ends: the
	// position that may be confirmed once this entry and every one before
	// it are published.
	lsn    pglogrepl.LSN
	commit time.Time
	state  uint8
}

const (
	pending uint8 = iota
	sending
	sent
)

// pipeline holds what a session read and has not confirmed, in log order,
// and hands it to the broker: several Publish calls at once, a window of
// messages in flight, never two messages of one aggregate at once (a
// Publish call may deliver its messages in any order), so that a message is
// sent only after the previous one of its aggregate was confirmed.
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
	r        *Relay
	ctx      context.Context // the session's: publishing stops with it
	maxCalls int

	mu       sync.Mutex
	entries  []*entry // log order; the confirmed ones leave from the front
	first    int      // no pending entry before this index
	nextSeq  uint64   // the seq of the next entry added
	shown    uint64   // the entries whose seq is below are visible
	keys     map[string]bool
	calls    int
	unsent   int // messages read and not confirmed by the broker
	progress chan struct{}
	added    chan struct{} // wakes watch
	wg       sync.WaitGroup
}

func newPipeline(ctx context.Context, r *Relay) *pipeline {
	p := &pipeline{
		r: r, ctx: ctx,
		maxCalls: max(2, min(8, (r.cfg.Window+r.cfg.BatchSize-1)/r.cfg.BatchSize)),
		nextSeq:  1,
		shown:    1,
		keys:     map[string]bool{},
		progress: make(chan struct{}, 1),
		added:    make(chan struct{}, 1),
	}
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
	for _, e := range es {
		if e.hasMsg {
			p.unsent++
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
			if len(xids) > 0 {
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
			p.dispatchLocked()
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

// dispatchLocked starts Publish calls for the pending messages whose
// aggregate has none in flight, and none pending before them.
func (p *pipeline) dispatchLocked() {
	if p.calls >= p.maxCalls || p.ctx.Err() != nil {
		return
	}
	var blocked map[string]bool
	var batch []*entry
	firstPending := -1
	i := p.first
	for ; i < len(p.entries) && p.entries[i].seq < p.shown; i++ {
		e := p.entries[i]
		if e.state != pending {
			continue
		}
		if p.keys[e.key] || blocked[e.key] {
			if firstPending < 0 {
				firstPending = i
			}
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[e.key] = true
			continue
		}
		e.state = sending
		p.keys[e.key] = true
		batch = append(batch, e)
		if len(batch) == p.r.cfg.BatchSize {
			p.launchLocked(batch)
			batch = nil
			if p.calls >= p.maxCalls {
				if firstPending < 0 {
					firstPending = i + 1
				}
				p.first = firstPending
				return
			}
		}
	}
	if len(batch) > 0 {
		p.launchLocked(batch)
	}
	if firstPending < 0 {
		firstPending = i // the first entry not seen visible, or the end
	}
	p.first = firstPending
}

func (p *pipeline) launchLocked(batch []*entry) {
	p.calls++
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.publish(batch)
	}()
}

// publish publishes batch until the broker confirmed every message, retrying
// the failed ones with backoff, or until the session ends.
func (p *pipeline) publish(batch []*entry) {
	r := p.r
	failures := 0
	for len(batch) > 0 {
		msgs := make([]idem.Message, len(batch))
		for i, e := range batch {
			msgs[i] = e.msg
		}
		ctx, cancel := context.WithTimeout(p.ctx, r.cfg.PublishTimeout)
		start := time.Now()
		err := r.pub.Publish(ctx, msgs)
		cancel()
		d := time.Since(start)
		r.stats.calls.Add(1)
		if r.cfg.ObservePublish != nil {
			r.cfg.ObservePublish(len(msgs), d, err)
		}
		results := broker.Results(err, len(msgs))
		var batchErr *broker.BatchError
		whole := err != nil && !errors.As(err, &batchErr)
		var failed, refused []*entry
		var refusals []error
		var firstErr error
		now := time.Now()
		p.mu.Lock()
		for i, e := range batch {
			if results[i] != nil {
				firstErr = cmpErr(firstErr, results[i])
				if !whole && !broker.IsFault(results[i]) {
					// The broker refused this message itself.
					e.refusals++
					if q := r.cfg.QuarantineAfter; q > 0 && e.refusals >= q {
						refused = append(refused, e)
						refusals = append(refusals, results[i])
						continue
					}
				}
				failed = append(failed, e)
				continue
			}
			e.state = sent
			delete(p.keys, e.key)
			p.unsent--
			if r.cfg.ObserveCommitToPublish != nil {
				r.cfg.ObserveCommitToPublish(now.Sub(e.commit))
			}
		}
		r.stats.inFlight.Store(int64(p.unsent))
		p.mu.Unlock()
		r.stats.published.Add(int64(len(batch) - len(failed) - len(refused)))
		for i, e := range refused {
			if perr := r.park(p.ctx, e, refusals[i]); perr != nil {
				if p.ctx.Err() == nil {
					r.log.Warn("quarantining a message the broker refused failed; publishing it again", "error", perr)
				}
				failed = append(failed, refused[i:]...)
				break
			}
			p.mu.Lock()
			e.state = sent
			e.id = "" // the row stays, quarantined
			delete(p.keys, e.key)
			p.unsent--
			r.stats.inFlight.Store(int64(p.unsent))
			p.mu.Unlock()
		}
		if len(failed) < len(batch) {
			r.errs.publish.OK(p.ctx)
			p.signal()
		}
		batch = failed
		if len(batch) == 0 {
			break
		}
		if p.ctx.Err() != nil {
			break
		}
		failures++
		r.stats.failures.Add(1)
		r.setErr(firstErr)
		delay := r.backoff(failures)
		r.errs.publish.Warn(p.ctx, "publish failed; retrying the same messages before their aggregates go on", firstErr,
			"messages", len(batch), "attempt", failures, "retry_in", delay.Round(time.Millisecond))
		if !ctxsleep.Sleep(p.ctx, delay) {
			break
		}
	}
	if failures > 0 && len(batch) == 0 {
		r.setErr(nil)
	}
	p.mu.Lock()
	p.calls--
	p.dispatchLocked()
	p.mu.Unlock()
	p.signal()
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (p *pipeline) signal() {
	select {
	case p.progress <- struct{}{}:
	default:
	}
}

// confirmed takes the entries published from the front, and returns the
// position they reach (0 when none ends a transaction), the ids of the rows
// to delete, and the commit times of the transactions they end.
func (p *pipeline) confirmed() (lsn pglogrepl.LSN, ids []string, commits []time.Time) {
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
		return 0, nil, nil
	}
	for _, e := range p.entries[:last] {
		if e.id != "" {
			ids = append(ids, e.id)
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
	return lsn, ids, commits
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
func (p *pipeline) wait() { p.wg.Wait() }
