// Package ordered publishes messages in per-key order with several Publish
// calls in flight: the one publishing core of every relay (the polling
// relay, the CDC relay's stream and its initial sweep, and any further log
// reader).
//
// Entries are added in the order of their source (outbox seq, log
// position). Entries of one key (an aggregate) form a chain: an entry goes
// to the broker only once the previous entry of its key was confirmed, since
// a Publish call may deliver its messages in any order. Chains advance
// independently, in up to Config.Calls concurrent calls.
//
// Each result is classified by Classify, once for every relay: published,
// refused by the broker (counted toward quarantine), or a fault (the broker
// did not answer: never counted). What happens to a failed entry depends on
// the Mode:
//
//   - GiveBack (the polling relay): a failed entry ends with its outcome and
//     the later entries of its key stay unsent; a call that fails as a
//     whole halts the publisher. The caller gives the rows back to the
//     database (release, quarantine) after Wait.
//   - Retry (the CDC relays, whose log cannot skip ahead): a failed entry is
//     published again after Config.Backoff until it is confirmed, or, once
//     refused Config.QuarantineAfter times, handed to Config.Park; the key
//     goes on after it.
package ordered

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/mutant"
)

// Outcome is what became of an entry.
type Outcome uint8

const (
	// Unsent: the entry was not confirmed and has no failure of its own:
	// never handed to the broker (the publisher halted, an earlier entry of
	// its key failed), or its last call was cut short by a stop.
	Unsent Outcome = iota
	// Published: the broker confirmed it.
	Published
	// Refused: the broker refused it, fewer than Config.QuarantineAfter
	// times in all (GiveBack mode).
	Refused
	// Quarantined: the broker refused it Config.QuarantineAfter times in
	// all. In Retry mode, Config.Park has set it aside.
	Quarantined
	// Fault: the broker did not answer for it (GiveBack mode).
	Fault
)

// String returns the outcome in lower case.
func (o Outcome) String() string {
	switch o {
	case Unsent:
		return "unsent"
	case Published:
		return "published"
	case Refused:
		return "refused"
	case Quarantined:
		return "quarantined"
	case Fault:
		return "fault"
	}
	return "outcome(?)"
}

// Result is the classification of one message of a Publish call.
type Result uint8

const (
	// Accepted: the broker confirmed the message.
	Accepted Result = iota
	// Rejected: the broker refused the message itself (unroutable, nacked,
	// too large, or a whole call marked with broker.Refused).
	Rejected
	// NoAnswer: the broker did not answer for the message (a timeout, a
	// lost connection, an error marked idem.Transient, a whole call that
	// failed otherwise).
	NoAnswer
)

// Classify turns the error of a Publish call over n messages into one
// Result and one error per message, and reports whether the call failed as
// a whole (an error that is not a *broker.BatchError).
func Classify(err error, n int) (results []Result, errs []error, whole bool) {
	errs = broker.Results(err, n)
	results = make([]Result, n)
	if err == nil {
		return results, errs, false
	}
	var be *broker.BatchError
	whole = !errors.As(err, &be) || len(be.Errs) != n
	for i, e := range errs {
		switch {
		case e == nil:
			results[i] = Accepted
		case broker.IsRefused(e):
			results[i] = Rejected
		case whole || broker.IsFault(e):
			results[i] = NoAnswer
		default:
			results[i] = Rejected
		}
	}
	return results, errs, whole
}

// Entry is one message on its way to the broker.
type Entry struct {
	// Key orders the entries: those of one key are published one after the
	// other, in the order they were added.
	Key string
	// Msg is the message.
	Msg idem.Message
	// Refusals is the number of times the broker refused the message before
	// (an outbox row's attempts); the publisher adds the refusals it meets.
	Refusals int
	// Ref is the caller's: an index in its own slice, for example.
	Ref int

	// Outcome, Err (the last failure) and At (when the broker confirmed the
	// entry) are set by the publisher once the entry's fate is known; Sent
	// when the last Publish call that carried it started.
	Outcome Outcome
	Err     error
	At      time.Time
	Sent    time.Time

	next *Entry // the next entry of the key
	done bool
}

// Mode is what the publisher does with a message that failed.
type Mode uint8

const (
	// GiveBack ends a failed entry with its outcome; the later entries of
	// its key stay unsent, and a fault halts the publisher.
	GiveBack Mode = iota
	// Retry publishes a failed entry again until it is confirmed or
	// quarantined.
	Retry
)

// Config configures a Publisher.
type Config struct {
	// Publish sends msgs, the messages of batch (in the same order), and
	// returns the broker's answer (see broker.Publisher). It may change
	// msgs' headers (trace context) and count or time the call. Required.
	Publish func(ctx context.Context, batch []*Entry, msgs []idem.Message) error
	// Calls is the number of Publish calls in flight at most (at least 1).
	Calls int
	// MinCall and MaxCall bound the messages of a call: the ready messages
	// are spread over the free calls, at least MinCall in each when that
	// many are ready, at most MaxCall (0: no limit).
	MinCall, MaxCall int
	// Timeout bounds each call (0: none).
	Timeout time.Duration
	// QuarantineAfter is the number of refusals after which an entry is
	// quarantined (0: never).
	QuarantineAfter int
	// Mode says what happens to failed entries.
	Mode Mode

	// Proceed, when set, is asked before each call, with the number of calls
	// started so far: false starts no more calls (the rest stays Unsent).
	Proceed func(started int) bool
	// Halt, when closed, starts no more calls and ends the waits between
	// retries.
	Halt <-chan struct{}
	// Backoff returns the wait before the next attempt after failures
	// failed calls in a row (Retry mode). Required in Retry mode.
	Backoff func(failures int) time.Duration
	// Park sets aside an entry refused QuarantineAfter times (Retry mode):
	// nil, and the later entries of its key go on; an error, and it is
	// published again. Required in Retry mode with QuarantineAfter > 0.
	Park func(ctx context.Context, e *Entry) error

	// Settled, when set, is called once for each entry whose fate is known,
	// in the goroutine of its call, outside the publisher's lock.
	Settled func(e *Entry)
	// Down, when set, is called when the broker answered for none of the
	// messages of a call (a fault of the whole broker; GiveBack mode then
	// halts). Answered is called after a call the broker answered for at
	// least one message, with the number of messages it did not answer for.
	Down     func(err error)
	Answered func(faults int)
	// Failed, when set, is called in Retry mode before waiting to publish
	// again the failed messages of a call: their number, the failures in a
	// row, the first error and the wait.
	Failed func(n, failures int, err error, wait time.Duration)
}

// Publisher publishes entries in per-key order. Create it with New, give
// it entries with Add, and Wait for them.
type Publisher struct {
	cfg Config
	ctx context.Context

	mu      sync.Mutex
	tails   map[string]*Entry // the last entry added of each key with an entry not done
	ready   []*Entry          // heads that can go to the broker, in order
	calls   int               // in flight
	started int
	halted  bool
	idle    *sync.Cond // signalled when calls reaches 0
}

// New returns a publisher whose calls run under ctx: when it ends, calls are
// cancelled and no more start.
func New(ctx context.Context, cfg Config) *Publisher {
	cfg.Calls = max(1, cfg.Calls)
	cfg.MinCall = max(1, cfg.MinCall)
	if mutant.Enabled && mutant.On(mutant.RelayDropOne) {
		cfg.Publish = dropOne(cfg.Publish)
	}
	p := &Publisher{cfg: cfg, ctx: ctx, tails: map[string]*Entry{}}
	p.idle = sync.NewCond(&p.mu)
	return p
}

// Add appends entries, in their source order, and starts the calls it
// can. It never blocks on the broker.
func (p *Publisher) Add(es ...*Entry) {
	if mutant.Enabled && mutant.On(mutant.RelaySwap) {
		es = swapPairs(es)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range es {
		if t, ok := p.tails[e.Key]; ok {
			t.next = e
		} else {
			p.ready = append(p.ready, e)
		}
		p.tails[e.Key] = e
	}
	p.dispatchLocked()
}

// Wait returns when no call is in flight and none can start: every entry
// added is done, or the rest waits behind a failure, a halt or the end of
// the publisher's context.
func (p *Publisher) Wait() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.calls > 0 {
		p.idle.Wait()
	}
}

// Halted reports whether the publisher stopped starting calls (GiveBack mode,
// after a fault or a false Proceed).
func (p *Publisher) Halted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.halted
}

// stopped reports whether no call may start.
func (p *Publisher) stopped() bool {
	if p.halted || p.ctx.Err() != nil {
		return true
	}
	if p.cfg.Halt != nil {
		select {
		case <-p.cfg.Halt:
			return true
		default:
		}
	}
	return false
}

// dispatchLocked starts calls for the ready heads while calls are free.
func (p *Publisher) dispatchLocked() {
	for len(p.ready) > 0 && p.calls < p.cfg.Calls {
		if p.stopped() {
			return
		}
		if p.cfg.Proceed != nil && !p.cfg.Proceed(p.started) {
			p.halted = true
			return
		}
		free := p.cfg.Calls - p.calls
		size := max(p.cfg.MinCall, (len(p.ready)+free-1)/free)
		if p.cfg.MaxCall > 0 {
			size = min(size, p.cfg.MaxCall)
		}
		size = min(size, len(p.ready))
		batch := make([]*Entry, size)
		copy(batch, p.ready)
		p.ready = p.ready[size:]
		p.calls++
		p.started++
		go p.run(batch)
	}
}

// run publishes batch, then again its failed entries in Retry mode, and
// hands the keys that can go on to the next calls.
func (p *Publisher) run(batch []*Entry) {
	failures := 0
	for len(batch) > 0 {
		retry, fault, err := p.call(batch)
		if len(retry) == 0 || p.cfg.Mode == GiveBack {
			if fault && p.cfg.Mode == GiveBack {
				p.mu.Lock()
				p.halted = true
				p.mu.Unlock()
			}
			break
		}
		failures++
		wait := p.cfg.Backoff(failures)
		if p.cfg.Failed != nil {
			p.cfg.Failed(len(retry), failures, err, wait)
		}
		if !p.sleep(wait) {
			break
		}
		batch = retry
	}
	p.mu.Lock()
	p.calls--
	p.dispatchLocked()
	if p.calls == 0 {
		p.idle.Broadcast()
	}
	p.mu.Unlock()
}

// sleep waits d, and reports false when the context ended or Halt closed
// first.
func (p *Publisher) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.ctx.Done():
		return false
	case <-p.cfg.Halt: // a nil channel never fires
		return false
	}
}

// call publishes batch once and settles its entries. It returns the entries
// to publish again (Retry mode), whether the broker failed to answer for
// every message (a fault of the whole broker), and the first error.
func (p *Publisher) call(batch []*Entry) (retry []*Entry, down bool, first error) {
	msgs := make([]idem.Message, len(batch))
	sent := time.Now()
	for i, e := range batch {
		msgs[i] = e.Msg
		e.Sent = sent
	}
	ctx, cancel := p.ctx, context.CancelFunc(func() {})
	if p.cfg.Timeout > 0 {
		ctx, cancel = context.WithTimeout(p.ctx, p.cfg.Timeout)
	}
	err := p.cfg.Publish(ctx, batch, msgs)
	cancel()
	at := time.Now()
	results, errs, _ := Classify(err, len(batch))
	var faults int
	var settled, next []*Entry
	for i, e := range batch {
		switch results[i] {
		case Accepted:
			e.Outcome, e.Err, e.At = Published, nil, at
			settled = append(settled, e)
			next = append(next, e)
			continue
		case NoAnswer:
			faults++
			e.Err = errs[i]
			if first == nil {
				first = errs[i]
			}
			if p.cfg.Mode == Retry || errors.Is(errs[i], context.Canceled) && p.ctx.Err() != nil {
				// Retry mode, or cut short by the end of the publisher's
				// context: no outcome of its own.
				if p.cfg.Mode == Retry {
					retry = append(retry, e)
				} else {
					e.Outcome = Unsent
					settled = append(settled, e)
				}
				continue
			}
			e.Outcome = Fault
			settled = append(settled, e)
			continue
		}
		// Rejected.
		e.Err = errs[i]
		if first == nil {
			first = errs[i]
		}
		e.Refusals++
		if q := p.cfg.QuarantineAfter; q > 0 && e.Refusals >= q {
			if p.cfg.Mode == Retry {
				if perr := p.cfg.Park(p.ctx, e); perr != nil {
					retry = append(retry, e)
					continue
				}
				next = append(next, e)
			}
			e.Outcome = Quarantined
			settled = append(settled, e)
			continue
		}
		if p.cfg.Mode == Retry {
			retry = append(retry, e)
			continue
		}
		e.Outcome = Refused
		settled = append(settled, e)
	}
	down = faults == len(batch)
	switch {
	case down && p.cfg.Down != nil && p.ctx.Err() == nil:
		p.cfg.Down(first)
	case !down && p.cfg.Answered != nil:
		p.cfg.Answered(faults)
	}
	for _, e := range settled {
		e.done = true
		if p.cfg.Settled != nil {
			p.cfg.Settled(e)
		}
	}
	p.mu.Lock()
	for _, e := range next {
		p.advanceLocked(e)
	}
	p.mu.Unlock()
	return retry, down, first
}

// advanceLocked makes the entry after e, if any, ready.
func (p *Publisher) advanceLocked(e *Entry) {
	if e.next != nil {
		p.ready = append(p.ready, e.next)
		return
	}
	if p.tails[e.Key] == e {
		delete(p.tails, e.Key)
	}
}

// published counts the messages handed to Publish calls in the process,
// for the mutant RelayDropOne.
var published atomic.Int64

// dropOne is the mutant RelayDropOne: publish leaves out the N-th message
// of the process (mutant.Arg, default 10) and reports it confirmed. Only
// builds with the tag idemmutant call it.
func dropOne(publish func(ctx context.Context, batch []*Entry, msgs []idem.Message) error) func(ctx context.Context, batch []*Entry, msgs []idem.Message) error {
	n, err := strconv.ParseInt(mutant.Arg(mutant.RelayDropOne), 10, 64)
	if err != nil || n < 1 {
		n = 10
	}
	return func(ctx context.Context, batch []*Entry, msgs []idem.Message) error {
		i := int(n - 1 - (published.Add(int64(len(msgs))) - int64(len(msgs))))
		switch {
		case i < 0 || i >= len(msgs):
			return publish(ctx, batch, msgs)
		case len(msgs) == 1:
			return nil
		}
		err := publish(ctx, slices.Delete(slices.Clone(batch), i, i+1), slices.Delete(slices.Clone(msgs), i, i+1))
		var be *broker.BatchError
		if errors.As(err, &be) && len(be.Errs) == len(msgs)-1 {
			return &broker.BatchError{Errs: slices.Insert(slices.Clone(be.Errs), i, nil)}
		}
		return err
	}
}

// swapPairs is the mutant RelaySwap: of each key with several entries in
// es, the first two change places. Only builds with the tag idemmutant
// call it.
func swapPairs(es []*Entry) []*Entry {
	es = slices.Clone(es)
	first := map[string]int{}
	done := map[string]bool{}
	for j, e := range es {
		i, seen := first[e.Key]
		switch {
		case !seen:
			first[e.Key] = j
		case !done[e.Key]:
			es[i], es[j] = es[j], es[i]
			done[e.Key] = true
		}
	}
	return es
}
