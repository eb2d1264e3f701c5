package logengine

import (
	"context"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/mutant"
	"github.com/idem-go/idem/internal/pausewatch"
	"github.com/idem-go/idem/relay/internal/ordered"
	"github.com/idem-go/idem/relay/internal/sendspan"
	"github.com/idem-go/idem/relay/logrelay"
)

// entry is a message read from the log, or the end of a transaction with
// no message to publish.
type entry struct {
	row    Row
	hasMsg bool
	key    string // aggregate type and id
	// mark is, on the first entry of a transaction, what the visibility
	// check needs (Tx.Mark); nil when nothing needs waiting for.
	mark any
	// seq numbers the entries in log order, from 1 in a session.
	seq uint64
	// out is the message on its way to the broker (package ordered).
	out *ordered.Entry
	// pos, when not nil, is the end of the transaction this entry ends:
	// the position that may be made durable once this entry and every one
	// before it are published.
	pos     any
	foreign bool
	commit  time.Time
	// read is when the relay read the transaction's commit; shown when it
	// was seen visible and handed to the publisher.
	read, shown time.Time
	sent        bool // published, parked, or without a message
	// archive is set once the broker confirmed the message, when the
	// relay archives what it publishes (Config.ArchiveRetention).
	archive bool
}

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
// sessions. A server sends a transaction a moment before it ends for other
// sessions (PostgreSQL once its commit is flushed to the WAL, longer when a
// synchronous standby must confirm it; MariaDB once it is written to the
// binlog, before the storage engine commits it): a consumer that reads the
// producer's database on the event would not find its rows yet. A
// goroutine (watch) asks the Reader, in one call for every transaction
// read since its last answer, which ones are visible, and lets the entries
// through in log order up to the first one that is not.
type pipeline struct {
	r   *Relay
	rd  Reader
	ctx context.Context // the session's: publishing stops with it
	pub *ordered.Publisher

	mu       sync.Mutex
	entries  []*entry // log order; the confirmed ones leave from the front
	first    int      // the first entry not handed to pub
	nextSeq  uint64   // the seq of the next entry added
	shown    uint64   // the entries whose seq is below are visible
	byOut    map[*ordered.Entry]*entry
	unsent   int  // messages read and not confirmed by the broker
	handed   int  // messages handed to pub and not settled yet
	inPart   bool // the last Tx added was a Part: its transaction goes on (add's goroutine only)
	progress chan struct{}
	added    chan struct{} // wakes watch
	wg       sync.WaitGroup
}

func newPipeline(ctx context.Context, r *Relay, rd Reader) *pipeline {
	p := &pipeline{
		r: r, rd: rd, ctx: ctx,
		nextSeq:  1,
		shown:    1,
		byOut:    map[*ordered.Entry]*entry{},
		progress: make(chan struct{}, 1),
		added:    make(chan struct{}, 1),
	}
	p.pub = ordered.New(ctx, ordered.Config{
		Publish: func(ctx context.Context, batch []*ordered.Entry, msgs []idem.Message) error {
			start := time.Now()
			spans := r.cfg.Tracing.Start(ctx, msgs, func(j int) (int64, int) { return 0, batch[j].Refusals + 1 })
			err := r.cfg.Publisher.Publish(ctx, msgs)
			sendspan.End(spans, err)
			r.C.Calls.Add(1)
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
		Backoff:         r.Backoff,
		Park: func(ctx context.Context, out *ordered.Entry) error {
			p.mu.Lock()
			e := p.byOut[out]
			p.mu.Unlock()
			return r.park(ctx, Refused{Rec: e.row.Rec, WAL: e.row.WAL, Refusals: out.Refusals, Earlier: e.row.Refusals, Err: out.Err})
		},
		Settled:  p.settled,
		Answered: func(int) { r.errs.publish.OK(p.ctx); r.SetErr(nil) },
		Failed: func(n, failures int, err error, wait time.Duration) {
			r.C.Failures.Add(1)
			r.SetErr(err)
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

// add appends a committed transaction.
func (p *pipeline) add(tx *Tx) {
	if len(tx.Rows) > 0 {
		if !p.inPart {
			p.r.C.Txs.Add(1)
		}
		if fault.Enabled {
			fault.Point(fault.CDCAfterReceive)
		}
	}
	p.inPart = tx.Part
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(tx.Rows) == 0 && tx.Mark == nil && len(p.entries) > 0 {
		// A transaction without events after another one without events:
		// move the latter's position.
		if last := p.entries[len(p.entries)-1]; !last.hasMsg && last.mark == nil {
			last.pos = tx.Pos
			last.foreign = last.foreign || tx.Foreign
			return
		}
	}
	now := time.Now()
	if len(tx.Rows) == 0 {
		p.appendLocked(&entry{pos: tx.Pos, foreign: tx.Foreign, commit: tx.Commit, read: now, sent: true, mark: tx.Mark})
	}
	for i, row := range tx.Rows {
		e := &entry{row: row, hasMsg: true, key: row.Rec.AggregateType + "\x00" + row.Rec.AggregateID, commit: tx.Commit, read: now}
		if i == 0 {
			e.mark = tx.Mark
		}
		if i == len(tx.Rows)-1 {
			e.pos = tx.Pos
		}
		p.unsent++
		e.out = &ordered.Entry{Key: e.key, Msg: row.Msg, Refusals: row.Refusals}
		p.byOut[e.out] = e
		p.appendLocked(e)
	}
	p.r.C.InFlight.Store(int64(p.unsent))
	if p.r.C.Oldest.Load() == 0 && !tx.Commit.IsZero() {
		p.r.C.Oldest.Store(p.oldestLocked())
	}
	select {
	case p.added <- struct{}{}:
	default:
	}
}

func (p *pipeline) appendLocked(e *entry) {
	e.seq = p.nextSeq
	p.nextSeq++
	p.entries = append(p.entries, e)
}

// oldestLocked returns the commit time of the oldest entry that has one,
// in unix nanos, 0 when none has.
func (p *pipeline) oldestLocked() int64 {
	for _, e := range p.entries {
		if !e.commit.IsZero() {
			return e.commit.UnixNano()
		}
	}
	return 0
}

// watch lets entries through once their transactions are visible, until
// the session ends. Each round asks about every transaction read and not
// yet seen visible; while one is not, it asks again after a short wait.
func (p *pipeline) watch() {
	r := p.r
	failures := 0
	// The pause is read at least once per interval, added rows or not:
	// Stats and health show it while the log is quiet.
	tick := time.NewTicker(pausewatch.Interval)
	defer tick.Stop()
	for {
		select {
		case <-p.added:
		case <-tick.C:
			if r.paused(p.ctx) {
				continue
			}
		case <-p.ctx.Done():
			return
		}
		// An operator's pause holds what was read here: the window fills,
		// the reader waits, and the position stays where it was confirmed.
		if !r.waitUnpaused(p.ctx, nil) {
			return
		}
		for waits := 0; ; {
			marks, seqs, end := p.unseen()
			if end == 0 {
				break // nothing waits
			}
			shown := end
			if len(marks) > 0 && !(mutant.Enabled && mutant.On(mutant.CDCSkipVisibility)) {
				qctx, cancel := context.WithTimeout(p.ctx, r.cfg.QueryTimeout)
				n, err := p.rd.FirstInvisible(qctx, marks)
				cancel()
				if err != nil {
					if p.ctx.Err() != nil {
						return
					}
					failures++
					r.SetErr(err)
					d := r.Backoff(failures)
					r.errs.visibility.Warn(p.ctx, "checking that committed transactions are visible failed; their messages wait", err, "retry_in", d.Round(time.Millisecond))
					if !ctxsleep.Sleep(p.ctx, d) {
						return
					}
					continue
				}
				if failures > 0 {
					failures = 0
					r.SetErr(nil)
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
			r.C.VisibilityWaits.Add(1)
			waits++
			if !ctxsleep.Sleep(p.ctx, backoff.Doubled(VisibleWaitMin, VisibleWaitMax, waits)) {
				return
			}
		}
	}
}

// The waits of watch while a transaction is not visible yet: usually a
// matter of microseconds, so the first is short; a commit that waits for
// a synchronous standby may take long, so they grow, to a cap that keeps
// the delay after its end small and the checks to 200 a second. They
// double without jitter (backoff.Doubled): no other process shares them.
// An adapter that waits for a transaction the same way uses them too.
const (
	VisibleWaitMin = 100 * time.Microsecond
	VisibleWaitMax = 5 * time.Millisecond
)

// unseen returns the marks of the transactions not yet seen visible, in
// log order, with the seq of each one's first entry, and the seq after the
// last entry (0 when every entry was seen visible).
func (p *pipeline) unseen() (marks []any, seqs []uint64, end uint64) {
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
		if e.mark != nil {
			marks = append(marks, e.mark)
			seqs = append(seqs, e.seq)
		}
	}
	return marks, seqs, p.nextSeq
}

// handLocked hands the entries seen visible to the publisher, in log
// order.
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
	p.handed += len(out)
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
		e.row.Delete = "" // the row stays, quarantined
	}
	e.archive = out.Outcome == ordered.Published && r.Archiving()
	p.unsent--
	p.handed--
	r.C.InFlight.Store(int64(p.unsent))
	p.mu.Unlock()
	if out.Outcome == ordered.Published {
		r.C.Published.Add(1)
		if !e.commit.IsZero() {
			if r.cfg.Observer.CommitToPublish != nil {
				r.cfg.Observer.CommitToPublish(out.At.Sub(e.commit))
			}
			if r.cfg.Observer.Stages != nil {
				r.cfg.Observer.Stages(logrelay.Stages{
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

// confirmed is what the published entries at the front reach.
type confirmed struct {
	end     *entry // the last transaction end; nil when none
	ids     []string
	archive []*driver.OutboxRecord
	// commits are the commit times of the transactions with events they
	// end.
	commits         []time.Time
	events, foreign bool
}

// confirmed takes the published entries from the front, visible ones
// only: their rows are deleted and their events archived, and the end of
// the last whole transaction among them is the position to confirm. The
// entries of a transaction not entirely published or read (Tx.Part) go as
// well: its rows are deleted as they are published, and its position
// waits for its end.
func (p *pipeline) confirmed() (c confirmed) {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := 0
	for last < len(p.entries) && p.entries[last].sent && p.entries[last].seq < p.shown {
		last++
	}
	if last == 0 {
		return c
	}
	for _, e := range p.entries[:last] {
		if e.row.Delete != "" {
			c.ids = append(c.ids, e.row.Delete)
		}
		if e.archive {
			c.archive = append(c.archive, e.row.Rec)
		}
		c.events = c.events || e.hasMsg
		c.foreign = c.foreign || e.foreign
		if e.pos != nil {
			c.end = e
			if e.hasMsg && !e.commit.IsZero() {
				c.commits = append(c.commits, e.commit)
			}
		}
	}
	p.entries = append(p.entries[:0:0], p.entries[last:]...)
	p.first = max(0, p.first-last)
	p.r.C.Oldest.Store(p.oldestLocked())
	return c
}

// drainWait waits until the broker confirmed every message read, and
// reports whether it did before ctx ended. While an operator's pause holds
// the relay, it waits for the messages handed to the broker only: the
// others wait for the next session, after the position made durable.
func (p *pipeline) drainWait(ctx context.Context) bool {
	t := time.NewTimer(pausewatch.Interval)
	defer t.Stop()
	for {
		p.mu.Lock()
		n, handed := p.unsent, p.handed
		p.mu.Unlock()
		if n == 0 || (handed == 0 && p.r.paused(ctx)) {
			return true
		}
		t.Reset(pausewatch.Interval)
		select {
		case <-p.progress:
		case <-t.C:
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
