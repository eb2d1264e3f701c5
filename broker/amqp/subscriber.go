package amqp

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/internal/batch"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/ctxsleep"
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
	// StandbyPollDefault is how often a subscriber standing by tries to
	// become the queue's consumer.
	StandbyPollDefault = time.Second
	// PartitionsMax is the most partitions a consumer may have: one bucket
	// per partition (see Buckets).
	PartitionsMax = Buckets
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	ConnConfig
	// Exchange is the topic exchange the queue is bound to. Defaults to
	// "events".
	Exchange string
	// Queue is the consuming service's durable queue, for example
	// "stock.events". Required. With Partitions, it names the partition
	// queues "<Queue>.p<k>" and the exchanges "<Queue>.part<Partitions>" and
	// "<Queue>.nobucket".
	Queue string
	// Bindings are the routing-key patterns binding Queue to Exchange, for
	// example "order.#" or "order.order.placed.v1".
	Bindings []string
	// QueueType is Classic (the default, declared as version 2) or Quorum.
	QueueType QueueType
	// NoDeclare skips declaring the exchange, the queue and its bindings,
	// which must then exist (the partition topology too); a quorum queue
	// must then have x-single-active-consumer, which the subscriber cannot
	// check: without it, several subscribers would consume it at once.
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
	// StandbyPoll is how often a subscriber standing by (another process
	// consumes the queue) tries again to become its consumer. Defaults to
	// 1s.
	StandbyPoll time.Duration
	// Partitions, when above 0, splits the consumer's messages over that many
	// queues, "<Queue>.p0" to "<Queue>.p<Partitions-1>", by the bucket header
	// the Publisher sets from the key (the aggregate id): bucket b goes to
	// partition b mod Partitions, through the headers exchange
	// PartitionExchange(Queue, Partitions) bound to Exchange with Bindings.
	// Messages without the bucket header go to partition 0. At most
	// PartitionsMax (64). Every subscriber of the consumer must use the same
	// value; to change it, drain the queues first (see the package
	// documentation). 0, the default, consumes Queue itself.
	Partitions int
	// Partition is the partition this subscriber consumes, 0 to
	// Partitions-1; run one subscriber per partition (inbox's ownership
	// group spreads them over the processes).
	Partition int
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
	if c.StandbyPoll == 0 {
		c.StandbyPoll = StandbyPollDefault
	}
	return c
}

// ConsumedQueue returns the queue the subscriber consumes: Queue, or its
// partition queue "<Queue>.p<Partition>" when Partitions is set.
func (c SubscriberConfig) ConsumedQueue() string {
	if c.Partitions > 0 {
		return PartitionQueue(c.Queue, c.Partition)
	}
	return c.Queue
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
	case c.BatchLinger < 0 || c.RequeueDelay < 0 || c.StandbyPoll < 0:
		return errors.New("idem: amqp: SubscriberConfig.BatchLinger, RequeueDelay and StandbyPoll must not be negative")
	case c.Partitions < 0 || c.Partitions > PartitionsMax:
		return fmt.Errorf("idem: amqp: SubscriberConfig.Partitions %d: want 0 (unpartitioned) to %d (PartitionsMax: "+
			"each partition takes at least one of the %d buckets the publisher spreads aggregates over)", c.Partitions, PartitionsMax, Buckets)
	case c.Partitions == 0 && c.Partition != 0:
		return fmt.Errorf("idem: amqp: SubscriberConfig.Partition %d without Partitions: set Partitions too", c.Partition)
	case c.Partitions > 0 && (c.Partition < 0 || c.Partition >= c.Partitions):
		return fmt.Errorf("idem: amqp: SubscriberConfig.Partition %d: want 0 to %d (Partitions - 1)", c.Partition, c.Partitions-1)
	}
	return nil
}

// Subscriber consumes a queue and feeds an idempotent consumer. It acks a
// message only after the consumer's transaction committed (or the message was
// parked in the failure store).
//
// A subscriber is its queue's only consumer: it consumes a classic queue
// with the exclusive flag, and declares quorum queues with
// x-single-active-consumer. Another subscriber of the same queue, in this
// process or another, stands by: it tries again every StandbyPoll and takes
// over when the active one stops or dies (RabbitMQ then puts the messages
// the dead one held back at the head of the queue, in order). So one
// aggregate's events are applied in order, one at a time, however many
// processes run; to share the work, use Partitions.
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
	queue   string // the queue consumed: cfg.ConsumedQueue()
	deliver broker.DeliverFunc
	log     *slog.Logger
	errs    *errlog.Limiter // the connection's failures
	seed    maphash.Seed
	held    atomic.Int64

	// active is set while the subscriber consumes its queue (for a quorum
	// queue, once RabbitMQ delivered to it); standing is set once the
	// subscriber has logged that it stands by, until it is active.
	active   atomic.Bool
	standing bool

	// base is the lifecycle; its WorkContext, given to the consumer, ends
	// when Stop runs out of time.
	base startstop.Base

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
		queue:   cfg.ConsumedQueue(),
		deliver: deliver,
		log:     cfg.Logger.With("queue", cfg.ConsumedQueue()),
		seed:    maphash.MakeSeed(),
	}
	s.errs = errlog.New(s.log, "amqp subscriber connection", errlog.Config{})
	return s, nil
}

// Start connects, declares the topology and starts consuming, or standing
// by when another subscriber consumes the queue. ctx bounds the start-up
// only; the subscriber then runs until Stop. It returns an error if the
// first connection, declaration or consume fails (other than the queue
// being in use); after that, connection losses are handled by
// reconnecting. A Stop during Start interrupts the connection attempt.
func (s *Subscriber) Start(ctx context.Context) error {
	if err := s.base.Starting(); err != nil {
		return fmt.Errorf("idem: amqp: subscriber: %w", err)
	}
	ctx, cancel := s.base.StartContext(ctx)
	defer cancel()
	sess, err := s.connect(ctx)
	if err == nil {
		if err = s.consume(sess); err != nil && !errors.Is(err, errInUse) {
			_ = sess.conn.Close()
		}
	}
	if err != nil && !errors.Is(err, errInUse) {
		s.base.StartFailed()
		return err
	}
	s.mu.Lock()
	s.sess = sess
	s.mu.Unlock()
	go s.run(sess, err)
	if !s.base.Running() {
		s.cancelSession() // stopped during the start-up
	}
	return nil
}

// Active reports whether the subscriber is its queue's consumer now, rather
// than standing by while another subscriber (another process, usually)
// consumes it, or reconnecting. For a quorum queue, where RabbitMQ picks
// the single active consumer among those attached without telling them,
// it reports true from the first message RabbitMQ delivered to this
// subscriber.
func (s *Subscriber) Active() bool { return s.active.Load() }

// Stop stops consuming, finishes the batches in progress, acknowledges them
// and closes the connections, and returns once all that has ended. If ctx
// ends first, work in progress is abandoned (the connection is closed: its
// messages are redelivered later) and Stop returns ctx's error at once; Done
// is closed once the subscriber has ended. Stop is idempotent and safe to
// call from several goroutines.
func (s *Subscriber) Stop(ctx context.Context) error {
	return s.base.Stop(ctx, s.cancelSession, func() {
		s.mu.Lock()
		if s.sess != nil {
			_ = s.sess.conn.Close()
		}
		s.mu.Unlock()
	})
}

// cancelSession stops the current session's consumer: its deliveries end,
// the batches in progress finish. A session standing by sees Stopping
// itself.
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

// errInUse means another consumer holds the queue: the subscriber stands
// by.
var errInUse = errors.New("idem: amqp: the queue is in exclusive use by another consumer")

// errStopping ends a standby when the subscriber stops.
var errStopping = errors.New("idem: amqp: subscriber stopping")

// session is one connection with its consuming channel.
type session struct {
	conn       *amqp091.Connection
	ch         *amqp091.Channel // the channel of the next consume; nil after a refused one
	tag        string
	consuming  atomic.Pointer[amqp091.Channel] // ch, once consuming
	deliveries <-chan amqp091.Delivery
	chClosed   chan *amqp091.Error
	connClosed chan *amqp091.Error
}

func (ss *session) cancel() {
	if ch := ss.consuming.Load(); ch != nil {
		_ = ch.Cancel(ss.tag, false)
	}
}

func (ss *session) close() {
	if ss.ch != nil {
		_ = ss.ch.Close()
	}
	_ = ss.conn.Close()
}

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

// connect opens a session: connection, channel, topology.
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
		if s.cfg.Partitions > 0 {
			err = declarePartitions(ch, s.cfg.Exchange, s.cfg.Queue, s.cfg.QueueType, s.cfg.Bindings, s.cfg.Partitions)
		} else {
			err = declareQueue(ch, s.cfg.Exchange, s.cfg.Queue, s.cfg.QueueType, s.cfg.Bindings)
		}
		if err != nil {
			return nil, err
		}
	}
	ok = true
	return &session{
		conn:       conn,
		ch:         ch,
		tag:        "idem-" + s.queue + "-" + uuid.NewString(),
		connClosed: conn.NotifyClose(make(chan *amqp091.Error, 1)),
	}, nil
}

// consume starts consuming the queue on the session, as its only consumer:
// with the exclusive flag on a classic queue (RabbitMQ ignores it on quorum
// queues, declared with x-single-active-consumer instead). It returns
// errInUse when another consumer holds the queue.
func (s *Subscriber) consume(sess *session) error {
	if sess.ch == nil {
		ch, err := sess.conn.Channel()
		if err != nil {
			return fmt.Errorf("idem: amqp: open channel: %w", err)
		}
		sess.ch = ch
	}
	ch := sess.ch
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		sess.ch = nil
		return fmt.Errorf("idem: amqp: set prefetch: %w", err)
	}
	chClosed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	exclusive := s.cfg.QueueType != Quorum
	deliveries, err := ch.Consume(s.queue, sess.tag, false, exclusive, false, false, nil)
	if err != nil {
		sess.ch = nil // the broker closed it
		var ae *amqp091.Error
		if errors.As(err, &ae) && ae.Code == amqp091.AccessRefused && strings.Contains(ae.Reason, "exclusive use") {
			return errInUse
		}
		return fmt.Errorf("idem: amqp: consume queue %q: %w", s.queue, err)
	}
	sess.chClosed, sess.deliveries = chClosed, deliveries
	sess.consuming.Store(ch)
	if s.stopping() {
		go sess.cancel() // Stop ran before the consumer was there to cancel
	}
	if exclusive {
		s.becameActive()
	} else if !s.standing {
		s.standing = true
		s.log.Info("amqp subscriber: attached to the quorum queue; RabbitMQ delivers to its single active consumer only")
	}
	return nil
}

// becameActive records that the subscriber consumes its queue, and logs it
// once per activation.
func (s *Subscriber) becameActive() {
	if !s.active.Swap(true) {
		s.standing = false
		s.log.Info("amqp subscriber: active: consuming the queue as its only consumer")
	}
}

// standBy retries consuming the queue every StandbyPoll until the
// subscriber consumes it (nil), the connection is lost, or the subscriber
// stops. It logs once that it stands by.
func (s *Subscriber) standBy(sess *session) error {
	if !s.standing {
		s.standing = true
		s.log.Info("amqp subscriber: standing by: another consumer holds the queue; trying again every StandbyPoll", "standby_poll", s.cfg.StandbyPoll)
	}
	t := time.NewTimer(s.cfg.StandbyPoll)
	defer t.Stop()
	for {
		select {
		case <-s.base.Stopping():
			return errStopping
		case e := <-sess.connClosed:
			return describeClose("connection", e)
		case <-t.C:
		}
		if err := s.consume(sess); !errors.Is(err, errInUse) {
			return err
		}
		t.Reset(s.cfg.StandbyPoll)
	}
}

// run serves sessions until Stop, standing by while another consumer holds
// the queue and reconnecting after each loss. err is the first consume's
// outcome.
func (s *Subscriber) run(sess *session, err error) {
	defer s.base.Finished()
	stop, work := s.base.StopContext(), s.base.WorkContext()
	bo := backoff.Backoff{Base: s.cfg.ReconnectMin, Max: s.cfg.ReconnectMax}
	for {
		if errors.Is(err, errInUse) {
			err = s.standBy(sess)
		}
		if err == nil {
			err = s.serve(sess)
		}
		s.active.Store(false)
		sess.close()
		s.mu.Lock()
		s.sess = nil
		s.mu.Unlock()
		if s.stopping() {
			return
		}
		s.errs.Warn(work, "amqp subscriber: connection lost; reconnecting", err, "url", s.cfg.redacted())
		for {
			if !ctxsleep.Sleep(stop, bo.Next()) {
				return
			}
			ctx, cancel := context.WithTimeout(stop, s.cfg.DialTimeout) // Stop ends an attempt
			sess, err = s.connect(ctx)
			cancel()
			if err == nil {
				if err = s.consume(sess); err == nil || errors.Is(err, errInUse) {
					break
				}
				sess.close()
			}
			if s.stopping() {
				return
			}
			s.errs.Warn(work, "amqp subscriber: reconnect failed", err, "url", s.cfg.redacted())
		}
		bo.Reset()
		s.errs.OK(work) // logs "amqp subscriber connection recovered"
		s.mu.Lock()
		s.sess = sess
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
		func(d amqp091.Delivery) int {
			if !s.active.Load() {
				s.becameActive() // a quorum queue's single active consumer
			}
			return s.worker(d, n)
		},
		func(_ int, batches <-chan []amqp091.Delivery) {
			w := batch.NewWorker[amqp091.Delivery](tr, batch.WorkerConfig{
				Deliver:      s.deliverAndFault,
				Context:      s.base.WorkContext(),
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

// worker picks the worker of d: by key (orderKey), so one aggregate's
// messages stay in order, else by message id.
func (s *Subscriber) worker(d amqp091.Delivery, n int) int {
	if n == 1 {
		return 0
	}
	key := d.MessageId
	if k := orderKey(d); k != "" {
		key = k
	}
	return int(maphash.String(s.seed, key) % uint64(n))
}

// sessionTransport settles a session's deliveries for batch.Worker.
type sessionTransport struct {
	s   *Subscriber
	ack *acker
}

func (t sessionTransport) Key(d amqp091.Delivery) string { return orderKey(d) }

// orderKey returns what orders d among the messages of its aggregate: the
// key header, else, on a binary CloudEvent another program published, its
// subject attribute (idem's publishers set the key header).
func orderKey(d amqp091.Delivery) string {
	for _, h := range [...]string{HeaderKey, "cloudEvents_subject", "cloudEvents:subject"} {
		if k, ok := headerString(d.Headers[h]); ok && k != "" {
			return k
		}
	}
	return ""
}

func (t sessionTransport) Delivery(d amqp091.Delivery, attempt int) broker.Delivery {
	del := toDelivery(d, t.s.queue)
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
// header (1 when absent). A content-type property other than
// application/json is the header idem.HeaderContentType (the Decoder reads
// CloudEvents by it; Publisher.Redeliver sets the property back from it).
// The redelivered flag is ignored: deduplication does not trust it.
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
			case HeaderBucket:
				continue // the publisher's routing, not the message's
			case idem.HeaderAttempt:
				if n, err := strconv.Atoi(s); err == nil && n > 0 {
					attempt = n
				}
			}
			msg.Headers[k] = s
		}
	}
	if d.ContentType != "" && d.ContentType != idem.ContentTypeJSON {
		if _, ok := msg.Headers[idem.HeaderContentType]; !ok {
			if msg.Headers == nil {
				msg.Headers = make(map[string]string, 1)
			}
			msg.Headers[idem.HeaderContentType] = d.ContentType
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
