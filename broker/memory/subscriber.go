package memory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/startstop"
)

// Defaults of SubscriberConfig.
const (
	// BatchSizeDefault is the most messages handed to the consumer in one
	// call.
	BatchSizeDefault = 16
	// ErrorRetryDelayDefault is how long a message whose delivery failed
	// with an error (neither handled nor parked) waits before it is
	// delivered again.
	ErrorRetryDelayDefault = time.Second
)

// queue is one consumer's messages, oldest first. The publisher's lock
// guards it.
type queue struct {
	name    string
	entries []*entry
}

// entry is a message waiting in a queue.
type entry struct {
	msg idem.Message
	// deliveries counts the times it was handed to a consumer.
	deliveries int
	// inflight: a subscriber holds it now.
	inflight bool
	// notBefore: it is not delivered again before (a retry's delay), while
	// heldBy, the subscriber that asked for the delay, runs.
	notBefore time.Time
	heldBy    *Subscriber
}

func (q *queue) push(m idem.Message) {
	q.entries = append(q.entries, &entry{msg: cloneMessage(m)})
}

func (q *queue) remove(e *entry) {
	for i, x := range q.entries {
		if x == e {
			q.entries = append(q.entries[:i], q.entries[i+1:]...)
			return
		}
	}
}

// queueLocked returns consumer's queue, created empty if there is none.
func (p *Publisher) queueLocked(consumer string) *queue {
	if p.queues == nil {
		p.queues = map[string]*queue{}
	}
	q := p.queues[consumer]
	if q == nil {
		q = &queue{name: consumer}
		p.queues[consumer] = q
	}
	return q
}

// Declare creates the queues of consumers that do not have one: every
// message accepted from then on is kept for each of them until a subscriber
// of that consumer acknowledges it, as a durable queue keeps messages while
// its consumer is away. NewSubscriber declares its consumer's queue.
func (p *Publisher) Declare(consumers ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range consumers {
		p.queueLocked(c)
	}
}

// Pending returns how many messages wait in consumer's queue, delivered or
// not, until acknowledged; 0 when it has no queue.
func (p *Publisher) Pending(consumer string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if q := p.queues[consumer]; q != nil {
		return len(q.entries)
	}
	return 0
}

// WaitPending blocks until nothing waits in consumer's queue, every
// message acknowledged, or ctx is done.
func (p *Publisher) WaitPending(ctx context.Context, consumer string) error {
	for {
		p.mu.Lock()
		q := p.queues[consumer]
		empty := q == nil || len(q.entries) == 0
		ch := p.changed
		p.mu.Unlock()
		if empty {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("memory: %d message(s) still wait for %s: %w", p.Pending(consumer), consumer, ctx.Err())
		}
	}
}

// Redeliver implements broker.Redeliverer: it puts msgs, as they are, at
// the end of the queue named source (the consumer's name, which
// Delivery.Source carries), and of no other. A source with no queue is an
// error. Fail and SetFunc do not apply to it.
func (p *Publisher) Redeliver(ctx context.Context, source string, msgs []idem.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.queues[source]
	if q == nil {
		return fmt.Errorf("memory: no queue %q: %w", source, broker.ErrUnroutable)
	}
	for _, m := range msgs {
		q.push(m)
	}
	p.notifyLocked()
	return nil
}

// PublishToConsumer implements broker.ConsumerPublisher: it puts msgs at
// the end of consumer's queue only (Redeliver: a consumer's queue has its
// name), where each starts a full set of attempts (the subscriber counts
// them itself, whatever the headers say).
func (p *Publisher) PublishToConsumer(ctx context.Context, consumer string, msgs []idem.Message) error {
	return p.Redeliver(ctx, consumer, msgs)
}

// Inspect implements broker.Inspector: for each consumer with a queue, the
// messages ready to be delivered (Ready, those waiting for a retry's delay
// included) and those a subscriber holds (Unacked). Lag and Consumers are
// -1 (unknown).
func (p *Publisher) Inspect(ctx context.Context, consumers []string) ([]broker.QueueStats, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []broker.QueueStats
	for _, c := range consumers {
		q := p.queues[c]
		if q == nil {
			continue
		}
		qs := broker.QueueStats{Consumer: c, Queue: q.name, Lag: -1, Consumers: -1}
		for _, e := range q.entries {
			if e.inflight {
				qs.Unacked++
			} else {
				qs.Ready++
			}
		}
		out = append(out, qs)
	}
	return out, nil
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Consumer is the consumer's name, which names its queue and is each
	// delivery's Source. Required.
	Consumer string
	// BatchSize is the most messages handed to the consumer in one call.
	// Defaults to 16.
	BatchSize int
	// ErrorRetryDelay is how long a message whose delivery failed with an
	// error waits before it is delivered again. Defaults to 1s.
	ErrorRetryDelay time.Duration
	// Logger receives the errors of deliveries. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SubscriberConfig) WithDefaults() SubscriberConfig {
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.ErrorRetryDelay = cmp.Or(c.ErrorRetryDelay, ErrorRetryDelayDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c SubscriberConfig) validate() error {
	switch {
	case c.Consumer == "":
		return errors.New("memory: SubscriberConfig.Consumer is required (the consumer's name, which names its queue)")
	case c.BatchSize < 0:
		return fmt.Errorf("memory: SubscriberConfig.BatchSize %d is negative", c.BatchSize)
	case c.ErrorRetryDelay < 0:
		return fmt.Errorf("memory: SubscriberConfig.ErrorRetryDelay %v is negative", c.ErrorRetryDelay)
	}
	return nil
}

// Subscriber delivers the messages of one consumer's queue to a
// broker.DeliverFunc (inbox.Consumer.DeliverBatch), one batch at a time,
// and acknowledges, retries or pauses as the dispositions say (see the
// package documentation). It implements broker.Subscriber.
type Subscriber struct {
	pub     *Publisher
	cfg     SubscriberConfig
	deliver broker.DeliverFunc
	base    startstop.Base

	// pausedUntil: no message is taken before it. The publisher's lock
	// guards it.
	pausedUntil time.Time
}

var _ broker.Subscriber = (*Subscriber)(nil)

// NewSubscriber returns a subscriber, not started, of cfg.Consumer's queue,
// which it declares (Declare): messages accepted from now on are kept for
// it.
func (p *Publisher) NewSubscriber(cfg SubscriberConfig, deliver broker.DeliverFunc) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deliver == nil {
		return nil, errors.New("memory: NewSubscriber: deliver is nil")
	}
	p.Declare(cfg.Consumer)
	return &Subscriber{pub: p, cfg: cfg, deliver: deliver}, nil
}

// Start starts delivering. It returns idem.ErrStarted if the subscriber was
// started already, idem.ErrStopped if it was stopped.
func (s *Subscriber) Start(ctx context.Context) error {
	if err := s.base.Starting(); err != nil {
		return fmt.Errorf("memory: subscriber: %w", err)
	}
	if err := ctx.Err(); err != nil {
		s.base.StartFailed()
		return err
	}
	go s.run()
	s.base.Running()
	return nil
}

// Stop stops taking messages, lets the batch in progress end and its
// dispositions apply, and returns once it has. When ctx ends first, the
// consumer's context is cancelled and Stop returns ctx's error; the batch
// ends in the background, and its messages that are not acknowledged stay
// in the queue. Stop is idempotent and safe from several goroutines.
func (s *Subscriber) Stop(ctx context.Context) error {
	return s.base.Stop(ctx, nil, nil)
}

// Done is closed once the subscriber has stopped and its last batch ended.
func (s *Subscriber) Done() <-chan struct{} { return s.base.Done() }

func (s *Subscriber) run() {
	defer s.base.Finished()
	defer s.release()
	stopping, work := s.base.Stopping(), s.base.WorkContext()
	for {
		select {
		case <-stopping:
			return
		default:
		}
		batch, changed, wait := s.take(time.Now())
		if len(batch) == 0 {
			if !s.sleep(stopping, changed, wait) {
				return
			}
			continue
		}
		ds := make([]broker.Delivery, len(batch))
		for i, e := range batch {
			ds[i] = broker.Delivery{Message: cloneMessage(e.msg), Source: s.cfg.Consumer, Attempt: e.deliveries}
		}
		disps, errs := s.deliver(work, ds)
		s.settle(batch, disps, errs, time.Now())
	}
}

// release gives back the messages the subscriber keeps waiting for a
// retry's delay: the next subscriber gets them at once, as a broker
// requeues what a consumer that left had not acknowledged.
func (s *Subscriber) release() {
	p := s.pub
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.queueLocked(s.cfg.Consumer).entries {
		if e.heldBy == s {
			e.heldBy, e.notBefore = nil, time.Time{}
		}
	}
	p.notifyLocked()
}

// sleep waits until the queue changes or wait has passed (forever when
// wait is 0); false when the subscriber stops first.
func (s *Subscriber) sleep(stopping, changed <-chan struct{}, wait time.Duration) bool {
	var timer <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-stopping:
		return false
	case <-changed:
	case <-timer:
	}
	return true
}

// take marks up to BatchSize messages of the queue as held and returns
// them, in queue order: each message whose key has no earlier message held
// or waiting for a retry. With none, it returns the channel that says the
// queue changed, and how long until a waiting message is due (0: none).
func (s *Subscriber) take(now time.Time) (batch []*entry, changed <-chan struct{}, wait time.Duration) {
	p := s.pub
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Before(s.pausedUntil) {
		return nil, p.changed, s.pausedUntil.Sub(now)
	}
	q := p.queueLocked(s.cfg.Consumer)
	blocked := map[string]bool{}
	for _, e := range q.entries {
		if len(batch) == s.cfg.BatchSize {
			break
		}
		key := string(e.msg.Key)
		if key != "" && blocked[key] {
			continue
		}
		if e.inflight || now.Before(e.notBefore) {
			if key != "" {
				blocked[key] = true
			}
			if !e.inflight {
				if d := e.notBefore.Sub(now); wait == 0 || d < wait {
					wait = d
				}
			}
			continue
		}
		e.inflight = true
		e.deliveries++
		batch = append(batch, e)
	}
	if len(batch) > 0 {
		p.notifyLocked()
	}
	return batch, p.changed, wait
}

// settle applies the consumer's dispositions to batch.
func (s *Subscriber) settle(batch []*entry, disps []broker.Disposition, errs []error, now time.Time) {
	p := s.pub
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.queueLocked(s.cfg.Consumer)
	for i, e := range batch {
		e.inflight, e.heldBy = false, s
		var d broker.Disposition
		var err error
		if i < len(disps) {
			d = disps[i]
		}
		if i < len(errs) {
			err = errs[i]
		}
		switch {
		case err != nil || i >= len(disps):
			if err == nil {
				err = fmt.Errorf("memory: the consumer answered %d disposition(s) for %d deliveries", len(disps), len(batch))
			}
			s.cfg.Logger.Warn("memory subscriber: delivery failed; delivered again later",
				"consumer", s.cfg.Consumer, "event_id", e.msg.EventID, "retry_in", s.cfg.ErrorRetryDelay, "error", err)
			e.notBefore = now.Add(s.cfg.ErrorRetryDelay)
		case d.Action == broker.Ack:
			q.remove(e)
		case d.Action == broker.Retry:
			e.notBefore = now.Add(d.RetryAfter)
		case d.Action == broker.Pause:
			e.notBefore = now.Add(d.RetryAfter)
			if until := now.Add(d.RetryAfter); until.After(s.pausedUntil) {
				s.pausedUntil = until
			}
		default:
			s.cfg.Logger.Warn("memory subscriber: unknown action; delivered again later",
				"consumer", s.cfg.Consumer, "event_id", e.msg.EventID, "action", d.Action)
			e.notBefore = now.Add(s.cfg.ErrorRetryDelay)
		}
	}
	p.notifyLocked()
}
