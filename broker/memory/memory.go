// Package memory is an in-process broker: a broker.Publisher that records
// what it accepts, and a broker.Subscriber per consumer that delivers it to
// an idempotent consumer in the same process. It needs no server, for
// tests, examples, benchmarks and a first hour with idem.
//
// The publisher records what it accepts, in order, and can be told to
// fail, to hang, or to accept messages and then report a failure (a lost
// confirm), per call or per message:
//
//	pub := memory.New()
//	pub.Fail(errors.New("broker down")) // every call fails until Recover
//	...
//	pub.Recover()
//	msgs := pub.Messages()
//
// Each consumer name has a queue, as each consuming service has its own
// queue on RabbitMQ: every message accepted once the queue exists (Declare,
// or NewSubscriber) is kept in it for that consumer until the consumer
// acknowledges it. A Subscriber feeds a consumer's DeliverBatch and does
// what its dispositions say, as the real transports do:
//
//	pub := memory.New()
//	sub, err := pub.NewSubscriber(memory.SubscriberConfig{Consumer: "stock"}, stock.DeliverBatch)
//	err = sub.Start(ctx)
//	// a relay publishing to pub; stock applies each event once
//	err = sub.Stop(ctx)
//
// Delivery is at least once and in order per key (the aggregate id): a
// message is removed from its queue when the consumer acknowledges it
// (Ack: applied, duplicate, ignored or parked); one it asks to retry is
// delivered again after Disposition.RetryAfter, the later messages of its
// key waiting behind it; a Pause holds back every message of the queue for
// its RetryAfter; a delivery that fails with an error is delivered again
// after a second. Messages not acknowledged when a subscriber stops stay in
// the queue, and the next subscriber gets them at once, a retry's delay
// forgotten, as a broker requeues what a consumer that left held. The
// queues live in memory only: they are lost with the process, which no
// real broker does.
//
// The publisher is a broker.Redeliverer (a parked message sent back to its
// consumer's queue, as "idem failed retry" does) and a broker.Inspector;
// Pending and WaitPending tell what waits for a consumer, so that a test
// waits until its messages are handled rather than sleeping.
package memory

import (
	"context"
	"sync"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// Action is what the publisher does with one Publish call. The zero Action
// accepts every message.
type Action struct {
	// Err fails the whole call: no message is accepted.
	Err error
	// Refuse, when not nil, is called for each message; a non-nil result
	// refuses that message (a per-message failure in a *broker.BatchError).
	Refuse func(idem.Message) error
	// Hang blocks the call until the channel is closed or the call's context
	// is done (then the call fails with the context's error).
	Hang <-chan struct{}
	// IgnoreContext makes Hang block until the channel is closed even after
	// the context is done, like a process paused in the middle of a call.
	// The call then goes on as if nothing happened.
	IgnoreContext bool
	// LoseConfirm accepts and records the messages, then reports Err (or a
	// generic error) to the caller: the broker has the messages but the
	// caller believes they failed.
	LoseConfirm bool
}

// Publisher is an in-process broker.Publisher. It is safe for concurrent use.
type Publisher struct {
	mu       sync.Mutex
	msgs     []idem.Message
	calls    int
	failErr  error
	decide   func(call int, msgs []idem.Message) Action
	changed  chan struct{}
	inflight int
	queues   map[string]*queue
}

var (
	_ broker.Publisher   = (*Publisher)(nil)
	_ broker.Redeliverer = (*Publisher)(nil)
	_ broker.Inspector   = (*Publisher)(nil)
)

// New returns a publisher that accepts everything.
func New() *Publisher {
	return &Publisher{changed: make(chan struct{})}
}

// SetFunc sets the function that decides the Action of each call; call counts
// from 1. Nil restores accepting everything.
func (p *Publisher) SetFunc(fn func(call int, msgs []idem.Message) Action) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.decide = fn
}

// Fail makes every call fail with err until Recover, whatever SetFunc says.
func (p *Publisher) Fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failErr = err
}

// Recover undoes Fail.
func (p *Publisher) Recover() { p.Fail(nil) }

// Publish implements broker.Publisher.
func (p *Publisher) Publish(ctx context.Context, msgs []idem.Message) error {
	p.mu.Lock()
	p.calls++
	call := p.calls
	act := Action{Err: p.failErr}
	if act.Err == nil && p.decide != nil {
		decide := p.decide
		p.mu.Unlock()
		act = decide(call, msgs)
		p.mu.Lock()
	}
	p.inflight++
	p.notifyLocked()
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inflight--
		p.notifyLocked()
		p.mu.Unlock()
	}()

	if act.Hang != nil {
		if act.IgnoreContext {
			<-act.Hang
		} else {
			select {
			case <-act.Hang:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	if act.Err != nil && !act.LoseConfirm {
		return act.Err
	}
	if err := ctx.Err(); err != nil && !act.IgnoreContext {
		return err
	}
	var errs []error
	if act.Refuse != nil {
		errs = make([]error, len(msgs))
	}
	p.mu.Lock()
	refused := false
	for i, m := range msgs {
		if act.Refuse != nil {
			if err := act.Refuse(m); err != nil {
				errs[i] = err
				refused = true
				continue
			}
		}
		p.msgs = append(p.msgs, cloneMessage(m))
		for _, q := range p.queues {
			q.push(m)
		}
	}
	p.notifyLocked()
	p.mu.Unlock()
	if act.LoseConfirm {
		if act.Err != nil {
			return act.Err
		}
		return errLostConfirm
	}
	if refused {
		return &broker.BatchError{Errs: errs}
	}
	return nil
}

type lostConfirmError struct{}

func (lostConfirmError) Error() string { return "memory: confirm lost" }

var errLostConfirm error = lostConfirmError{}

func cloneMessage(m idem.Message) idem.Message {
	m.Key = append([]byte(nil), m.Key...)
	m.Body = append([]byte(nil), m.Body...)
	if m.Headers != nil {
		h := make(map[string]string, len(m.Headers))
		for k, v := range m.Headers {
			h[k] = v
		}
		m.Headers = h
	}
	return m
}

func (p *Publisher) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Messages returns a copy of the accepted messages, in the order they were
// accepted.
func (p *Publisher) Messages() []idem.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]idem.Message(nil), p.msgs...)
}

// Len returns the number of accepted messages.
func (p *Publisher) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.msgs)
}

// Calls returns the number of Publish calls so far.
func (p *Publisher) Calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// Reset forgets the accepted messages. The consumers' queues keep theirs.
func (p *Publisher) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = nil
}

// Wait blocks until cond, called with the accepted messages and the number of
// calls in progress, returns true, or ctx is done.
func (p *Publisher) Wait(ctx context.Context, cond func(msgs []idem.Message, inflight int) bool) error {
	for {
		p.mu.Lock()
		ok := cond(p.msgs, p.inflight)
		ch := p.changed
		p.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WaitLen blocks until at least n messages were accepted or ctx is done.
func (p *Publisher) WaitLen(ctx context.Context, n int) error {
	return p.Wait(ctx, func(msgs []idem.Message, _ int) bool { return len(msgs) >= n })
}
