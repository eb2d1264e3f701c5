package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/internal/batch"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/startstop"
)

// Subscriber defaults.
const (
	// WorkersDefault is how many batches a subscriber handles at once.
	WorkersDefault = 2
	// BatchSizeDefault is the most messages given to the consumer at once.
	BatchSizeDefault = 100
	// BatchLingerDefault is how long a batch waits for more messages.
	BatchLingerDefault = 5 * time.Millisecond
	// AckWaitDefault is how long JetStream waits for an acknowledgement
	// before it delivers a message again. The subscriber extends it (with
	// "in progress" signals) while a batch is being handled.
	AckWaitDefault = 30 * time.Second
	// RequeueDelayDefault is how long a message that could be neither handled
	// nor parked waits before it is delivered again.
	RequeueDelayDefault = time.Second
	// resumeWaitMax caps the delay between attempts to consume again after
	// the iterator ended (connection closed, consumer deleted).
	resumeWaitMax = 2 * time.Second
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	ConnConfig
	// Stream is the stream the events are in. It is created, or updated to
	// this configuration, by Start unless NoDeclare is set.
	Stream StreamConfig
	// NoDeclare skips creating or updating the stream, which must then
	// exist. The durable consumer is always created or updated.
	NoDeclare bool
	// Consumer is the consuming service's name, for example "stock": the
	// name of its durable JetStream consumer and of its retry subjects. Use
	// the inbox consumer's name. Required; no dots, spaces or wildcards.
	Consumer string
	// Bindings are the event-name patterns the consumer receives, with NATS
	// wildcards: "order.>" (every event of service order),
	// "order.order.placed.v1", "*.order.*.v1". Empty means every event.
	// Patterns must not overlap.
	Bindings []string
	// Workers is how many batches are handled at once. Messages with the same
	// key (the aggregate id) always go to the same worker, so one
	// aggregate's events are handled in stream order, retries aside.
	// Defaults to 2.
	Workers int
	// BatchSize is the most messages given to the consumer at once, in one
	// transaction. Defaults to 100.
	BatchSize int
	// BatchLinger is how long a batch that is not full waits for more
	// messages. Defaults to 5ms.
	BatchLinger time.Duration
	// MaxAckPending is how many messages JetStream delivers ahead of their
	// acknowledgements. Defaults to 4 x Workers x BatchSize, at least 1000.
	MaxAckPending int
	// AckWait is how long JetStream waits for an acknowledgement before
	// delivering a message again. Defaults to 30s.
	AckWait time.Duration
	// MaxDeliver caps deliveries of a message by JetStream. Defaults to -1
	// (no cap): the consumer's retry policy decides when a message goes to
	// the failure store. A cap, if set, must exceed the policy's attempts.
	MaxDeliver int
	// RequeueDelay is how long a message that could be neither handled nor
	// parked (the database is down) waits before it is delivered again.
	// Defaults to 1s.
	RequeueDelay time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SubscriberConfig) WithDefaults() SubscriberConfig {
	c.ConnConfig = c.ConnConfig.withDefaults()
	c.Stream = c.Stream.WithDefaults()
	c.Workers = cmp.Or(c.Workers, WorkersDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.BatchLinger = cmp.Or(c.BatchLinger, BatchLingerDefault)
	c.MaxAckPending = cmp.Or(c.MaxAckPending, max(1000, 4*c.Workers*c.BatchSize))
	c.AckWait = cmp.Or(c.AckWait, AckWaitDefault)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, -1)
	c.RequeueDelay = cmp.Or(c.RequeueDelay, RequeueDelayDefault)
	return c
}

func (c SubscriberConfig) validate() error {
	if err := c.ConnConfig.validate("SubscriberConfig"); err != nil {
		return err
	}
	if err := c.Stream.validate("SubscriberConfig"); err != nil {
		return err
	}
	if err := checkToken(c.Consumer); err != nil {
		return fmt.Errorf("idem: nats: SubscriberConfig.Consumer %q %v (one durable consumer per consuming service, e.g. \"stock\")", c.Consumer, err)
	}
	for _, b := range c.Bindings {
		if err := checkSubject(b, true); err != nil {
			return fmt.Errorf("idem: nats: SubscriberConfig.Bindings: %q %v", b, err)
		}
	}
	switch {
	case c.Workers < 1:
		return fmt.Errorf("idem: nats: SubscriberConfig.Workers %d: want at least 1", c.Workers)
	case c.BatchSize < 1:
		return fmt.Errorf("idem: nats: SubscriberConfig.BatchSize %d: want at least 1", c.BatchSize)
	case c.MaxAckPending < c.BatchSize:
		return fmt.Errorf("idem: nats: SubscriberConfig.MaxAckPending %d: want at least BatchSize (%d)", c.MaxAckPending, c.BatchSize)
	case c.AckWait < time.Second:
		return fmt.Errorf("idem: nats: SubscriberConfig.AckWait %v: want at least 1s", c.AckWait)
	case c.MaxDeliver == 0 || c.MaxDeliver < -1:
		return fmt.Errorf("idem: nats: SubscriberConfig.MaxDeliver %d: want -1 (no cap) or a positive number", c.MaxDeliver)
	case c.BatchLinger < 0 || c.RequeueDelay < 0:
		return errors.New("idem: nats: SubscriberConfig.BatchLinger and RequeueDelay must not be negative")
	}
	return nil
}

// FilterSubjects returns the subjects the durable consumer reads: one per
// binding (or every event), and the consumer's retry subjects.
func (c SubscriberConfig) FilterSubjects() []string {
	c = c.WithDefaults()
	var out []string
	if len(c.Bindings) == 0 {
		out = append(out, c.Stream.SubjectPrefix+".>")
	}
	for _, b := range c.Bindings {
		out = append(out, c.Stream.SubjectPrefix+"."+b)
	}
	return append(out, c.Stream.retryPrefix()+"."+c.Consumer+".>")
}

// Subscriber reads a durable JetStream pull consumer and feeds an idempotent
// consumer. It acknowledges a message only after the consumer's transaction
// committed (or the message was parked in the failure store).
//
// A message the consumer asks to retry stays unacknowledged in the
// subscriber (kept in progress, so JetStream does not deliver it again)
// until its delay has passed, and the later messages of its aggregate (same
// key header) wait behind it while the other aggregates go on: one
// aggregate's events are applied in stream order through retries. When the
// consumer pauses (its database or a dependency is away), the worker stops
// taking messages until the pause ends; fetching stops once MaxAckPending
// messages are out. A subscriber that stops gives what it holds back to
// JetStream (negative acknowledgement). A message delivered again is not
// trusted to be a duplicate (nor a new message): it goes through the
// consumer's deduplication like any other.
//
// The durable consumer (explicit acks, deliver all) is named after
// SubscriberConfig.Consumer, so several processes of one service share its
// messages. Connection losses are handled by the client, which reconnects
// forever.
type Subscriber struct {
	cfg     SubscriberConfig
	deliver broker.DeliverFunc
	log     *slog.Logger
	seed    maphash.Seed
	// resumeErrs and ackErrs log the failures to consume again after the
	// iterator ended, and to acknowledge messages.
	resumeErrs, ackErrs *errlog.Limiter

	// base is the lifecycle; workCtx, given to the consumer, ends when Stop
	// runs out of time.
	base       startstop.Base
	workCtx    context.Context
	workCancel context.CancelFunc

	held atomic.Int64

	mu    sync.Mutex
	nc    *nats.Conn
	owned bool
	cons  jetstream.Consumer
	iter  jetstream.MessagesContext
}

// NewSubscriber returns a subscriber that hands what it receives to deliver,
// typically consumer.DeliverBatch.
func NewSubscriber(cfg SubscriberConfig, deliver broker.DeliverFunc) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deliver == nil {
		return nil, errors.New("idem: nats: NewSubscriber: deliver is nil")
	}
	s := &Subscriber{
		cfg:     cfg,
		deliver: deliver,
		log:     cfg.Logger.With("stream", cfg.Stream.Name, "consumer", cfg.Consumer),
		seed:    maphash.MakeSeed(),
	}
	s.resumeErrs = errlog.New(s.log, "nats subscriber consumption", errlog.Config{})
	s.ackErrs = errlog.New(s.log, "nats subscriber acknowledgements", errlog.Config{})
	s.workCtx, s.workCancel = context.WithCancel(context.Background())
	return s, nil
}

// ConsumerConfig returns the JetStream configuration of the durable
// consumer.
func (c SubscriberConfig) ConsumerConfig() jetstream.ConsumerConfig {
	c = c.WithDefaults()
	return jetstream.ConsumerConfig{
		Durable:        c.Consumer,
		Description:    "idem consumer " + c.Consumer,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.AckWait,
		MaxDeliver:     c.MaxDeliver,
		MaxAckPending:  c.MaxAckPending,
		FilterSubjects: c.FilterSubjects(),
	}
}

// Start connects, creates or updates the stream and the durable consumer,
// and starts consuming. It returns an error if any of that fails; after
// that, connection losses are handled by reconnecting.
func (s *Subscriber) Start(ctx context.Context) error {
	if err := s.base.Starting(); err != nil {
		return fmt.Errorf("idem: nats: subscriber: %w", err)
	}
	nc, owned, err := s.cfg.connect()
	if err != nil {
		s.base.StartFailed()
		return err
	}
	fail := func(err error) error {
		if owned {
			nc.Close()
		}
		s.base.StartFailed()
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(fmt.Errorf("idem: nats: %w", err))
	}
	if !s.cfg.NoDeclare {
		if err := ensureStream(ctx, js, s.cfg.Stream); err != nil {
			return fail(err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, s.cfg.Stream.Name, s.cfg.ConsumerConfig())
	if err != nil {
		return fail(fmt.Errorf("idem: nats: create or update consumer %s on stream %s: %w", s.cfg.Consumer, s.cfg.Stream.Name, err))
	}
	iter, err := messages(cons, s.cfg)
	if err != nil {
		return fail(err)
	}
	s.mu.Lock()
	s.nc, s.owned, s.cons, s.iter = nc, owned, cons, iter
	s.mu.Unlock()
	go s.run(iter)
	if !s.base.Running() {
		iter.Drain() // stopped during the start-up
	}
	return nil
}

func messages(cons jetstream.Consumer, cfg SubscriberConfig) (jetstream.MessagesContext, error) {
	iter, err := cons.Messages(jetstream.PullMaxMessages(min(cfg.MaxAckPending, 2*cfg.Workers*cfg.BatchSize)))
	if err != nil {
		return nil, fmt.Errorf("idem: nats: consume %s: %w", cfg.Consumer, err)
	}
	return iter, nil
}

// Stop stops fetching, hands the messages already received to the consumer,
// acknowledges them, closes the connection if the subscriber opened it, and
// returns once all that has ended. If ctx ends first, work in progress is
// abandoned (its messages are delivered again after AckWait) and ctx's error
// returned. Stop is idempotent and safe to call from several goroutines.
func (s *Subscriber) Stop(ctx context.Context) error {
	err := s.base.Stop(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.iter != nil {
			s.iter.Drain()
		}
	}, func() {
		s.workCancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.iter != nil {
			s.iter.Stop()
		}
	})
	s.workCancel()
	return err
}

// Done is closed when a started subscriber has stopped.
func (s *Subscriber) Done() <-chan struct{} { return s.base.Done() }

func (s *Subscriber) stopping() bool {
	select {
	case <-s.base.Stopping():
		return true
	default:
		return false
	}
}

// finish sends the last acknowledgements and closes the connection if the
// subscriber opened it.
func (s *Subscriber) finish() {
	s.mu.Lock()
	nc, owned := s.nc, s.owned
	s.mu.Unlock()
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := nc.FlushWithContext(fctx); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		s.log.Warn("nats subscriber: flush acknowledgements", "error", err)
	}
	cancel()
	if owned {
		nc.Close()
	}
}

// run reads messages until Stop, making a new iterator if one ends on its
// own (the consumer was deleted, the connection closed).
func (s *Subscriber) run(iter jetstream.MessagesContext) {
	defer s.base.Finished()
	defer s.finish()
	for {
		s.serve(iter)
		if s.stopping() {
			return
		}
		wait := s.cfg.ReconnectWait
		failed := false
		for {
			t := time.NewTimer(wait)
			select {
			case <-s.base.Stopping():
				t.Stop()
				return
			case <-t.C:
			}
			var err error
			iter, err = s.resume()
			if err == nil {
				break
			}
			s.resumeErrs.Warn(s.workCtx, "nats subscriber: resume consuming failed", err)
			failed = true
			wait = min(2*wait, resumeWaitMax)
		}
		s.mu.Lock()
		s.iter = iter
		if s.stopping() {
			iter.Drain()
		}
		s.mu.Unlock()
		s.resumeErrs.OK(s.workCtx) // after failures: "nats subscriber consumption recovered"
		if !failed {
			s.log.Info("nats subscriber: consuming again")
		}
	}
}

// resume recreates the consumer (it may have been deleted) and an iterator.
func (s *Subscriber) resume() (jetstream.MessagesContext, error) {
	ctx, cancel := context.WithTimeout(s.workCtx, s.cfg.DialTimeout)
	defer cancel()
	s.mu.Lock()
	nc := s.nc
	s.mu.Unlock()
	if nc.IsClosed() {
		return nil, nats.ErrConnectionClosed
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, s.cfg.Stream.Name, s.cfg.ConsumerConfig())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.cons = cons
	s.mu.Unlock()
	return messages(cons, s.cfg)
}

// serve dispatches the iterator's messages to the workers in batches until
// the iterator closes, then waits for the batches in progress.
func (s *Subscriber) serve(iter jetstream.MessagesContext) {
	in := make(chan jetstream.Msg)
	go func() {
		defer close(in)
		for {
			m, err := iter.Next()
			if err != nil {
				if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					return
				}
				if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
					s.log.Warn("nats subscriber: consumer gone; recreating it", "error", err)
					iter.Stop()
					return
				}
				if !s.stopping() {
					s.log.Debug("nats subscriber: fetch", "error", err)
				}
				continue
			}
			in <- m
		}
	}()

	n := s.cfg.Workers
	batch.Dispatch(in, n, s.cfg.BatchSize, s.cfg.BatchLinger,
		func(m jetstream.Msg) int { return s.worker(m, n) },
		func(_ int, batches <-chan []jetstream.Msg) {
			w := batch.NewWorker[jetstream.Msg](msgTransport{s}, batch.WorkerConfig{
				Deliver:      s.deliverBatch,
				Context:      s.workCtx,
				RequeueDelay: s.cfg.RequeueDelay,
				TouchEvery:   s.cfg.AckWait / 3,
				Logger:       s.log,
				OnHeld:       func(n int) { s.held.Add(int64(n)) },
			})
			w.Run(batches, s.base.Stopping())
		})
}

// Held returns the number of messages held unacknowledged while they, or an
// earlier message of their aggregate, wait for a retry or the end of a
// pause.
func (s *Subscriber) Held() int { return int(s.held.Load()) }

// worker picks the worker of m: by key header, so one aggregate's messages
// stay in order, else by event id.
func (s *Subscriber) worker(m jetstream.Msg, n int) int {
	if n == 1 {
		return 0
	}
	h := m.Headers()
	key := h.Get(HeaderKey)
	if key == "" {
		key = h.Get(idem.HeaderEventID)
	}
	return int(maphash.String(s.seed, key) % uint64(n))
}

// deliverBatch hands a batch to the consumer, then hits the fault point
// between the consumer's commit and the acknowledgements.
func (s *Subscriber) deliverBatch(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	disps, errs := s.deliver(ctx, ds)
	fault.Point(fault.NATSAfterHandleBeforeAck)
	return disps, errs
}

// msgTransport settles JetStream messages for batch.Worker.
type msgTransport struct{ s *Subscriber }

func (t msgTransport) Key(m jetstream.Msg) string { return m.Headers().Get(HeaderKey) }

func (t msgTransport) Delivery(m jetstream.Msg, attempt int) broker.Delivery {
	d := t.s.toDelivery(m)
	d.Attempt += attempt - 1
	return d
}

func (t msgTransport) Ack(ms []jetstream.Msg) {
	for _, m := range ms {
		if err := m.Ack(); err != nil {
			// The message comes back after AckWait and is deduplicated.
			t.s.ackErrs.Warn(t.s.workCtx, "nats subscriber: acknowledge message", err)
			continue
		}
		t.s.ackErrs.OK(t.s.workCtx)
	}
}

func (t msgTransport) Release(ms []jetstream.Msg) {
	for _, m := range ms {
		if err := m.Nak(); err != nil {
			t.s.log.Debug("nats subscriber: give back message (it comes back after AckWait)", "error", err)
		}
	}
}

func (t msgTransport) Touch(ms []jetstream.Msg) {
	for _, m := range ms {
		_ = m.InProgress()
	}
}

// toDelivery turns a JetStream message into what the consumer receives: the
// message as received, the durable consumer's name as its source (what
// Publisher.Redeliver takes, so that "idem failed retry" sends a parked
// message back to this consumer), and the attempt from JetStream's delivery
// count.
func (s *Subscriber) toDelivery(m jetstream.Msg) broker.Delivery {
	msg := idem.Message{Body: m.Data()}
	h := m.Headers()
	if len(h) > 0 {
		msg.Headers = make(map[string]string, len(h))
		for k, vs := range h {
			if len(vs) == 0 {
				continue
			}
			switch k {
			case jetstream.MsgIDHeader:
				continue
			case HeaderKey:
				msg.Key = []byte(vs[0])
				continue
			case HeaderAggregateType:
				msg.AggregateType = vs[0]
				continue
			}
			msg.Headers[k] = vs[0]
		}
	}
	msg.EventName = h.Get(idem.HeaderEventType)
	if msg.EventName == "" {
		msg.EventName = s.cfg.Stream.eventName(m.Subject())
	}
	id := h.Get(idem.HeaderEventID)
	if id == "" {
		id = h.Get(jetstream.MsgIDHeader)
	}
	if len(id) == 36 {
		if u, err := uuid.Parse(id); err == nil {
			msg.EventID = u
		}
	}
	attempt := 1
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 0 {
		attempt = int(md.NumDelivered)
	}
	return broker.Delivery{Message: msg, Source: s.cfg.Consumer, Attempt: attempt, System: broker.SystemNATS}
}

var (
	_ broker.Subscriber  = (*Subscriber)(nil)
	_ broker.Redeliverer = (*Publisher)(nil)
	_ broker.Describer   = (*Publisher)(nil)
)
