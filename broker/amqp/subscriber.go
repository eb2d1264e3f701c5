package amqp

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"

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
	// RequeueDelayDefault is how long a message that could be neither handled
	// nor parked waits before it is requeued.
	RequeueDelayDefault = time.Second
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	ConnConfig
	// Exchange is the topic exchange the queue is bound to. Defaults to
	// "events".
	Exchange string
	// Queue is the consuming service's durable queue, for example
	// "stock.events". Required.
	Queue string
	// Bindings are the routing-key patterns binding Queue to Exchange, for
	// example "order.#" or "order.order.placed.v1".
	Bindings []string
	// QueueType is Classic (the default, declared as version 2) or Quorum.
	QueueType QueueType
	// NoDeclare skips declaring the exchange, the queue and its bindings,
	// which must then exist.
	NoDeclare bool
	// Workers is how many batches are handled at once. Messages with the same
	// key header (the aggregate id) always go to the same worker, so one
	// aggregate's events are handled in queue order, retries aside. Defaults
	// to 2.
	Workers int
	// BatchSize is the most messages given to the consumer at once, in one
	// transaction. Defaults to 100.
	BatchSize int
	// BatchLinger is how long a batch that is not full waits for more
	// messages. Defaults to 5ms.
	BatchLinger time.Duration
	// Prefetch is how many unacknowledged messages RabbitMQ sends ahead.
	// Defaults to 2 x Workers x BatchSize, at least 256.
	Prefetch int
	// RequeueDelay is how long a message that could be neither handled nor
	// parked (the database is down) waits before it is requeued. Defaults to
	// 1s.
	RequeueDelay time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SubscriberConfig) WithDefaults() SubscriberConfig {
	c.ConnConfig = c.ConnConfig.withDefaults()
	if c.Exchange == "" {
		c.Exchange = ExchangeDefault
	}
	if c.QueueType == "" {
		c.QueueType = Classic
	}
	if c.Workers == 0 {
		c.Workers = WorkersDefault
	}
	if c.BatchSize == 0 {
		c.BatchSize = BatchSizeDefault
	}
	if c.BatchLinger == 0 {
		c.BatchLinger = BatchLingerDefault
	}
	if c.Prefetch == 0 {
		c.Prefetch = max(256, 2*c.Workers*c.BatchSize)
	}
	if c.RequeueDelay == 0 {
		c.RequeueDelay = RequeueDelayDefault
	}
	return c
}

func (c SubscriberConfig) validate() error {
	if err := c.ConnConfig.validate("SubscriberConfig"); err != nil {
		return err
	}
	switch {
	case c.Queue == "":
		return errors.New("idem: amqp: SubscriberConfig.Queue is required (one queue per consuming service, e.g. \"stock.events\")")
	case c.QueueType != Classic && c.QueueType != Quorum:
		return fmt.Errorf("idem: amqp: SubscriberConfig.QueueType %q: want %q or %q", c.QueueType, Classic, Quorum)
	case c.Workers < 1:
		return fmt.Errorf("idem: amqp: SubscriberConfig.Workers %d: want at least 1", c.Workers)
	case c.BatchSize < 1:
		return fmt.Errorf("idem: amqp: SubscriberConfig.BatchSize %d: want at least 1", c.BatchSize)
	case c.Prefetch < 1 || c.Prefetch > 65535:
		return fmt.Errorf("idem: amqp: SubscriberConfig.Prefetch %d: want 1 to 65535", c.Prefetch)
	case c.BatchLinger < 0 || c.RequeueDelay < 0:
		return errors.New("idem: amqp: SubscriberConfig.BatchLinger and RequeueDelay must not be negative")
	}
	return nil
}

// Subscriber consumes a queue and feeds an idempotent consumer. It acks a
// message only after the consumer's transaction committed (or the message was
// parked in the failure store).
//
// A message the consumer asks to retry stays unacknowledged in the
// subscriber until its delay has passed, and the later messages of its
// aggregate (same key header) wait behind it, unacknowledged too, while the
// other aggregates go on: a retried "order placed" is never overtaken by the
// "order cancelled" that followed it. When the consumer pauses (its database
// or a dependency is away), the worker stops taking messages until the
// pause ends, so RabbitMQ keeps them (up to Prefetch are held). Held
// messages count toward Prefetch; a subscriber that stops or loses its
// connection gives them back to the queue. A broker-redelivered message is
// not trusted to be a duplicate (nor a new message): it goes through the
// consumer's deduplication like any other.
//
// After the connection is lost (broker restart, network) the subscriber
// reconnects with backoff (at most ReconnectMax apart); messages in progress
// are redelivered by the broker and deduplicated by the consumer.
type Subscriber struct {
	cfg     SubscriberConfig
	deliver broker.DeliverFunc
	log     *slog.Logger
	errs    *errlog.Limiter // the connection's failures
	seed    maphash.Seed
	held    atomic.Int64

	// base is the lifecycle; workCtx, given to the consumer, ends when Stop
	// runs out of time.
	base       startstop.Base
	workCtx    context.Context
	workCancel context.CancelFunc

	mu   sync.Mutex
	sess *session
}

// NewSubscriber returns a subscriber that hands what it receives to deliver,
// typically consumer.DeliverBatch.
func NewSubscriber(cfg SubscriberConfig, deliver broker.DeliverFunc) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deliver == nil {
		return nil, errors.New("idem: amqp: NewSubscriber: deliver is nil")
	}
	s := &Subscriber{
		cfg:     cfg,
		deliver: deliver,
		log:     cfg.Logger.With("queue", cfg.Queue),
		seed:    maphash.MakeSeed(),
	}
	s.errs = errlog.New(s.log, "amqp subscriber connection", errlog.Config{})
	s.workCtx, s.workCancel = context.WithCancel(context.Background())
	return s, nil
}

// Start connects, declares the topology and starts consuming. ctx bounds
// the start-up only; the subscriber then runs until Stop. It returns an
// error if the first connection or declaration fails; after that,
// connection losses are handled by reconnecting.
func (s *Subscriber) Start(ctx context.Context) error {
	if err := s.base.Starting(); err != nil {
		return fmt.Errorf("idem: amqp: subscriber: %w", err)
	}
	sess, err := s.connect(ctx)
	if err != nil {
		s.workCancel()
		s.base.StartFailed()
		return err
	}
	s.mu.Lock()
	s.sess = sess
	s.mu.Unlock()
	go s.run(sess)
	if !s.base.Running() {
		s.cancelSession() // stopped during the start-up
	}
	return nil
}

// Stop stops consuming, finishes the batches in progress, acknowledges them
// and closes the connections, and returns once all that has ended. If ctx
// ends first, work in progress is abandoned (its messages are redelivered
// later) and ctx's error returned. Stop is idempotent and safe to call from
// several goroutines.
func (s *Subscriber) Stop(ctx context.Context) error {
	err := s.base.Stop(ctx, s.cancelSession, func() {
		s.workCancel()
		s.mu.Lock()
		if s.sess != nil {
			_ = s.sess.conn.Close()
		}
		s.mu.Unlock()
	})
	s.workCancel()
	return err
}

// cancelSession stops the current session's consumer: its deliveries end,
// the batches in progress finish.
func (s *Subscriber) cancelSession() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess != nil {
		go s.sess.cancel()
	}
}

func (s *Subscriber) stopping() bool {
	select {
	case <-s.base.Stopping():
		return true
	default:
		return false
	}
}

// session is one connection with its consuming channel.
type session struct {
	conn       *amqp091.Connection
	ch         *amqp091.Channel
	tag        string
	deliveries <-chan amqp091.Delivery
	chClosed   chan *amqp091.Error
	connClosed chan *amqp091.Error
}

func (ss *session) cancel() { _ = ss.ch.Cancel(ss.tag, false) }

// closeReason says why the session ended.
func (ss *session) closeReason() error {
	select {
	case e := <-ss.connClosed:
		if e != nil {
			return describeClose("connection", e)
		}
	default:
	}
	select {
	case e := <-ss.chClosed:
		if e != nil {
			return describeClose("channel", e)
		}
	default:
	}
	return errors.New("idem: amqp: consumer cancelled")
}

// connect opens a session: connection, topology, channel, consumer.
func (s *Subscriber) connect(ctx context.Context) (*session, error) {
	conn, err := s.cfg.dial(ctx)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = conn.Close()
		}
	}()
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("idem: amqp: open channel: %w", err)
	}
	if !s.cfg.NoDeclare {
		if err := declareExchange(ch, s.cfg.Exchange); err != nil {
			return nil, err
		}
		if err := declareQueue(ch, s.cfg.Exchange, s.cfg.Queue, s.cfg.QueueType, s.cfg.Bindings); err != nil {
			return nil, err
		}
	}
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("idem: amqp: set prefetch: %w", err)
	}
	ss := &session{
		conn:       conn,
		ch:         ch,
		tag:        "idem-" + s.cfg.Queue + "-" + uuid.NewString(),
		chClosed:   ch.NotifyClose(make(chan *amqp091.Error, 1)),
		connClosed: conn.NotifyClose(make(chan *amqp091.Error, 1)),
	}
	ss.deliveries, err = ch.Consume(s.cfg.Queue, ss.tag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("idem: amqp: consume queue %q: %w", s.cfg.Queue, err)
	}
	ok = true
	return ss, nil
}

// run serves sessions until Stop, reconnecting after each loss.
func (s *Subscriber) run(sess *session) {
	defer s.base.Finished()
	bo := backoff{min: s.cfg.ReconnectMin, max: s.cfg.ReconnectMax}
	for {
		err := s.serve(sess)
		_ = sess.ch.Close()
		_ = sess.conn.Close()
		s.mu.Lock()
		s.sess = nil
		s.mu.Unlock()
		if s.stopping() {
			return
		}
		s.errs.Warn(s.workCtx, "amqp subscriber: connection lost; reconnecting", err, "url", s.cfg.redacted())
		for {
			t := time.NewTimer(bo.next())
			select {
			case <-s.base.Stopping():
				t.Stop()
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(s.workCtx, s.cfg.DialTimeout)
			sess, err = s.connect(ctx)
			cancel()
			if err == nil {
				break
			}
			s.errs.Warn(s.workCtx, "amqp subscriber: reconnect failed", err, "url", s.cfg.redacted())
		}
		bo.reset()
		s.errs.OK(s.workCtx) // logs "amqp subscriber connection recovered"
		s.mu.Lock()
		s.sess = sess
		if s.stopping() {
			go sess.cancel()
		}
		s.mu.Unlock()
	}
}

// serve dispatches the session's deliveries to the workers in batches until
// the deliveries stop (consumer cancelled or connection lost), then waits for
// the workers, which give back what they hold.
func (s *Subscriber) serve(sess *session) error {
	ack := newAcker(sess.ch, s.cfg.Prefetch/2, s.log)
	tr := sessionTransport{s: s, ack: ack}
	n := s.cfg.Workers
	batch.Dispatch(sess.deliveries, n, s.cfg.BatchSize, s.cfg.BatchLinger,
		func(d amqp091.Delivery) int { return s.worker(d, n) },
		func(_ int, batches <-chan []amqp091.Delivery) {
			w := batch.NewWorker[amqp091.Delivery](tr, batch.WorkerConfig{
				Deliver:      s.deliverAndFault,
				Context:      s.workCtx,
				RequeueDelay: s.cfg.RequeueDelay,
				Logger:       s.log,
				OnHeld:       func(n int) { s.held.Add(int64(n)) },
			})
			w.Run(batches, s.base.Stopping())
		})
	return sess.closeReason()
}

// deliverAndFault delivers a batch, then hits the fault point between the
// consumer's commit and the acknowledgements.
func (s *Subscriber) deliverAndFault(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	disps, errs := s.deliver(ctx, ds)
	fault.Point(fault.InboxAfterCommitBeforeAck)
	return disps, errs
}

// Held returns the number of messages held unacknowledged while they, or an
// earlier message of their aggregate, wait for a retry or the end of a
// pause.
func (s *Subscriber) Held() int { return int(s.held.Load()) }

// worker picks the worker of d: by key header, so one aggregate's messages
// stay in order, else by message id.
func (s *Subscriber) worker(d amqp091.Delivery, n int) int {
	if n == 1 {
		return 0
	}
	key := d.MessageId
	if k, ok := headerString(d.Headers[HeaderKey]); ok && k != "" {
		key = k
	}
	return int(maphash.String(s.seed, key) % uint64(n))
}

// sessionTransport settles a session's deliveries for batch.Worker.
type sessionTransport struct {
	s   *Subscriber
	ack *acker
}

func (t sessionTransport) Key(d amqp091.Delivery) string {
	k, _ := headerString(d.Headers[HeaderKey])
	return k
}

func (t sessionTransport) Delivery(d amqp091.Delivery, attempt int) broker.Delivery {
	del := toDelivery(d, t.s.cfg.Queue)
	del.Attempt += attempt - 1
	return del
}

func (t sessionTransport) Ack(ds []amqp091.Delivery)     { t.ack.ack(tags(ds)) }
func (t sessionTransport) Release(ds []amqp091.Delivery) { t.ack.nack(tags(ds)) }
func (t sessionTransport) Touch([]amqp091.Delivery)      {}

func tags(ds []amqp091.Delivery) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.DeliveryTag
	}
	return out
}

// toDelivery turns an AMQP delivery into what the consumer receives: the
// message exactly as received, its queue, and the attempt from the attempt
// header (1 when absent). The redelivered flag is ignored: deduplication
// does not trust it.
func toDelivery(d amqp091.Delivery, queue string) broker.Delivery {
	msg := idem.Message{EventName: d.Type, Body: d.Body}
	if msg.EventName == "" && d.Exchange != "" {
		msg.EventName = d.RoutingKey
	}
	if id, err := uuid.Parse(d.MessageId); err == nil && len(d.MessageId) == 36 {
		msg.EventID = id
	}
	attempt := 1
	if len(d.Headers) > 0 {
		msg.Headers = make(map[string]string, len(d.Headers))
		for k, v := range d.Headers {
			s, ok := headerString(v)
			if !ok {
				continue
			}
			switch k {
			case HeaderKey:
				msg.Key = []byte(s)
				continue
			case idem.HeaderAttempt:
				if n, err := strconv.Atoi(s); err == nil && n > 0 {
					attempt = n
				}
			}
			msg.Headers[k] = s
		}
	}
	return broker.Delivery{Message: msg, Source: queue, Attempt: attempt, System: broker.SystemRabbitMQ}
}

// headerString returns a header value as text, for the value types that have
// one.
func headerString(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	case int8:
		return strconv.FormatInt(int64(v), 10), true
	case int16:
		return strconv.FormatInt(int64(v), 10), true
	case int32:
		return strconv.FormatInt(int64(v), 10), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case int:
		return strconv.Itoa(v), true
	case uint8:
		return strconv.FormatUint(uint64(v), 10), true
	case uint16:
		return strconv.FormatUint(uint64(v), 10), true
	case uint32:
		return strconv.FormatUint(uint64(v), 10), true
	case uint64:
		return strconv.FormatUint(v, 10), true
	case bool:
		return strconv.FormatBool(v), true
	case float32:
		return strconv.FormatFloat(float64(v), 'g', -1, 32), true
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), true
	case time.Time:
		return v.UTC().Format(time.RFC3339), true
	}
	return "", false
}

var (
	_ broker.Subscriber  = (*Subscriber)(nil)
	_ broker.Redeliverer = (*Publisher)(nil)
	_ broker.Describer   = (*Publisher)(nil)
)

// Done is closed when a started subscriber has stopped.
func (s *Subscriber) Done() <-chan struct{} { return s.base.Done() }
