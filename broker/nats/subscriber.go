package nats

import (
	"cmp"
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
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/internal/batch"
	"github.com/idem-go/idem/errlog"
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
	// AckWaitDefault is how long JetStream waits for an acknowledgement
	// before it delivers a message again. The subscriber extends it (with
	// "in progress" signals) while a batch is being handled.
	AckWaitDefault = 30 * time.Second
	// RequeueDelayDefault is how long a message that could be neither handled
	// nor parked waits before it is delivered again.
	RequeueDelayDefault = time.Second
	// OwnerTTLDefault is how long a subscriber's ownership of its durable
	// consumer lasts without renewal: after a kill, a standby takes over
	// within about this long.
	OwnerTTLDefault = 5 * time.Second
	// StandbyPollDefault is how often a standing-by subscriber tries to take
	// the durable consumer over.
	StandbyPollDefault = time.Second
	// OwnersBucketPrefix starts the name of the JetStream key-value bucket
	// holding the ownership leases of a stream's durable consumers:
	// idem_owners_<stream>.
	OwnersBucketPrefix = "idem_owners_"
	// resumeWaitMax caps the delay between attempts to consume again after
	// the iterator ended (connection closed, consumer deleted).
	resumeWaitMax = 2 * time.Second
	// requestTimeout bounds each JetStream request of a takeover or resume
	// (lease, consumer info, delete, create). Right after a leader change
	// or a cluster restart a request can go unanswered: it is cheaper to
	// ask again than to wait (each step is safe to repeat).
	requestTimeout = 3 * time.Second
	// pullExpiry is how long a pull request of the subscriber waits at the
	// server, and pullHeartbeat how often the server signals, while it
	// waits, that it still holds it. The client gives a pull request up
	// after two missed heartbeats and sends another: a request left on a
	// dead consumer leader (kill -9) costs about 2 x pullHeartbeat, not
	// nats.go's default 30s.
	pullExpiry    = 5 * time.Second
	pullHeartbeat = time.Second
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	ConnConfig
	// Stream is the stream the events are in. It is created, or updated to
	// this configuration, by Start unless NoDeclare is set.
	Stream StreamConfig
	// NoDeclare skips creating or updating the stream, which must then
	// exist (its partition count is checked all the same). The durable
	// consumer and the owners' key-value bucket are always created or
	// updated.
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
	// Partition is the partition this subscriber reads when the stream is
	// partitioned (Stream.Partitions > 0): from 0 to Stream.Partitions-1,
	// through the durable consumer <Consumer>-p<Partition>. Run one
	// subscriber per partition, spread over the service's processes (see
	// inbox's ownership group). Must be 0 when the stream is unpartitioned.
	Partition int
	// OwnerTTL is how long the subscriber's ownership of its durable
	// consumer (a lease in the key-value bucket idem_owners_<stream>) lasts
	// without renewal; it is renewed every OwnerTTL/3. Another process of
	// the service stands by until the lease is released (Stop) or has
	// expired (a killed or frozen process). It is the bucket's MaxAge,
	// shared by every subscriber of the stream: 0 (the default) takes the
	// existing bucket's, and creates the bucket with OwnerTTLDefault (5s);
	// another value than the existing bucket's makes Start fail with
	// ErrOwnerTTL (changing it under running subscribers would let one
	// renew too late); a new value takes deleting the bucket with every
	// subscriber of the stream stopped. At least 1s. In a cluster, a lease
	// shorter than an election (4 to 9s) is lost when the bucket's leader
	// dies: the owner stands by, takes it back and resets the consumer.
	OwnerTTL time.Duration
	// StandbyPoll is how often a standing-by subscriber tries to take the
	// durable consumer over. Defaults to 1s.
	StandbyPoll time.Duration
}

// WithDefaults returns c with zero fields set to their defaults; OwnerTTL
// and Stream.Replicas stay 0 (the existing bucket's and stream's).
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
	c.StandbyPoll = cmp.Or(c.StandbyPoll, StandbyPollDefault)
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
	case c.OwnerTTL != 0 && c.OwnerTTL < time.Second:
		return fmt.Errorf("idem: nats: SubscriberConfig.OwnerTTL %v: want at least 1s (or 0: the owners bucket's)", c.OwnerTTL)
	case c.StandbyPoll <= 0:
		return fmt.Errorf("idem: nats: SubscriberConfig.StandbyPoll %v: want a positive duration", c.StandbyPoll)
	case c.Stream.Partitions == 0 && c.Partition != 0:
		return fmt.Errorf("idem: nats: SubscriberConfig.Partition %d: the stream is unpartitioned (set Stream.Partitions)", c.Partition)
	case c.Stream.Partitions > 0 && (c.Partition < 0 || c.Partition >= c.Stream.Partitions):
		return fmt.Errorf("idem: nats: SubscriberConfig.Partition %d: want 0 to %d (Stream.Partitions - 1)", c.Partition, c.Stream.Partitions-1)
	}
	return nil
}

// Durable returns the name of the durable consumer: Consumer, or
// <Consumer>-p<Partition> when the stream is partitioned. It is the
// Delivery.Source of the messages the subscriber receives.
func (c SubscriberConfig) Durable() string {
	if c.Stream.Partitions > 0 {
		return c.Consumer + "-p" + strconv.Itoa(c.Partition)
	}
	return c.Consumer
}

// FilterSubjects returns the subjects the durable consumer reads: one per
// binding (or every event), in its partition when the stream is
// partitioned, and the durable consumer's retry subjects.
func (c SubscriberConfig) FilterSubjects() []string {
	c = c.WithDefaults()
	prefix := c.Stream.SubjectPrefix
	if c.Stream.Partitions > 0 {
		prefix = c.Stream.partitionPrefix() + "." + strconv.Itoa(c.Partition)
	}
	var out []string
	if len(c.Bindings) == 0 {
		out = append(out, prefix+".>")
	}
	for _, b := range c.Bindings {
		out = append(out, prefix+"."+b)
	}
	return append(out, c.Stream.retryPrefix()+"."+c.Durable()+".>")
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
// The durable consumer (explicit acks) is named after
// SubscriberConfig.Consumer (SubscriberConfig.Durable). One subscriber at a
// time consumes it: the subscriber that owns it, through a lease in the
// key-value bucket idem_owners_<stream> (created with the stream's
// replicas), which it renews every OwnerTTL/3 by compare-and-set. Another
// process of the service stands by (Active reports false) and tries to take
// the lease every StandbyPoll; it gets it when the owner stops (Stop
// releases it) or dies (the lease expires after OwnerTTL). A subscriber
// that fails to renew its lease (another one took it) stops fetching at
// once, leaves what it holds unacknowledged and stands by. On taking the
// lease, the subscriber resets the durable consumer to its acknowledgement
// floor (deletes it and creates it again, same configuration, starting
// after the floor), so that the messages a previous owner left
// unacknowledged are delivered again at once and in stream order, before
// the later ones. So extra processes never break one aggregate's order;
// to share the work, partition the stream (StreamConfig.Partitions,
// SubscriberConfig.Partition). Connection losses are handled by the client,
// which reconnects forever.
type Subscriber struct {
	cfg     SubscriberConfig
	deliver broker.DeliverFunc
	log     *slog.Logger
	seed    maphash.Seed
	// resumeErrs and ackErrs log the failures to consume again after the
	// iterator ended, and to acknowledge messages.
	resumeErrs, ackErrs *errlog.Limiter

	// base is the lifecycle; its WorkContext, given to the consumer, ends
	// when Stop runs out of time.
	base startstop.Base

	held atomic.Int64
	// ackFloor is the highest acknowledgement floor (stream sequence) a
	// reset read from the durable consumer.
	ackFloor atomic.Uint64
	// gaps counts the lost deliveries that made the subscriber reset its
	// durable consumer.
	gaps atomic.Int64
	// dropDelivery, set by tests only, drops the deliveries it returns
	// true for, as if they were lost on the way.
	dropDelivery func(jetstream.Msg) bool

	// lease is the ownership of the durable consumer; active tells whether
	// the subscriber holds it and consumes.
	lease  *lease
	active atomic.Bool
	// loggedStandby is set once the subscriber has logged that it stands
	// by, cleared when it becomes active (Start, then run's goroutine).
	loggedStandby bool

	mu    sync.Mutex
	nc    *nats.Conn
	owned bool
	js    jetstream.JetStream
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
		log:     cfg.Logger.With("stream", cfg.Stream.Name, "consumer", cfg.Durable()),
		seed:    maphash.MakeSeed(),
	}
	s.resumeErrs = errlog.New(s.log, "nats subscriber consumption", errlog.Config{})
	s.ackErrs = errlog.New(s.log, "nats subscriber acknowledgements", errlog.Config{})
	return s, nil
}

// ConsumerConfig returns the JetStream configuration of the durable
// consumer.
func (c SubscriberConfig) ConsumerConfig() jetstream.ConsumerConfig {
	c = c.WithDefaults()
	return jetstream.ConsumerConfig{
		Durable:        c.Durable(),
		Description:    "idem consumer " + c.Consumer,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.AckWait,
		MaxDeliver:     c.MaxDeliver,
		MaxAckPending:  c.MaxAckPending,
		FilterSubjects: c.FilterSubjects(),
	}
}

// Start connects, creates or updates the stream (after checking its
// partition count: ErrPartitions) and the owners' key-value bucket, tries
// once to take the durable consumer's lease and, when it gets it, resets
// the durable consumer and starts consuming; otherwise the subscriber
// stands by. It returns an error if any of that fails; after that,
// connection losses are handled by reconnecting. A Stop during Start
// interrupts the requests to the server.
func (s *Subscriber) Start(ctx context.Context) error {
	if err := s.base.Starting(); err != nil {
		return fmt.Errorf("idem: nats: subscriber: %w", err)
	}
	ctx, cancel := s.base.StartContext(ctx)
	defer cancel()
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
	stream, err := ensureStream(ctx, js, s.cfg.Stream, "SubscriberConfig", !s.cfg.NoDeclare, false, s.log)
	if err != nil {
		return fail(err)
	}
	s.cfg.Stream.Replicas = stream.Replicas // the owners bucket's

	l, err := newLease(ctx, js, s.cfg, s.log)
	if err != nil {
		return fail(err)
	}
	s.mu.Lock()
	s.nc, s.owned, s.js, s.lease = nc, owned, js, l
	s.mu.Unlock()
	// The owners bucket just created may have no leader yet (a cluster
	// electing one, under load): a fault, which costs time only.
	var held bool
	err = retryUnanswered(ctx, func(ctx context.Context) (err error) {
		held, err = l.acquire(ctx)
		return err
	})
	if err != nil {
		return fail(err)
	}
	var iter jetstream.MessagesContext
	if held {
		if iter, err = s.reset(ctx); err != nil {
			l.release(context.Background())
			return fail(err)
		}
		s.becomeActive()
	}
	go s.run(iter)
	if !s.base.Running() && iter != nil {
		iter.Drain() // stopped during the start-up
	}
	return nil
}

// Active reports whether the subscriber owns its durable consumer and
// consumes it; false while it stands by.
func (s *Subscriber) Active() bool { return s.active.Load() }

func messages(cons jetstream.Consumer, cfg SubscriberConfig) (jetstream.MessagesContext, error) {
	iter, err := cons.Messages(jetstream.PullMaxMessages(min(cfg.MaxAckPending, 2*cfg.Workers*cfg.BatchSize)),
		jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat))
	if err != nil {
		return nil, fmt.Errorf("idem: nats: consume %s: %w", cfg.Durable(), err)
	}
	return iter, nil
}

// reset recreates the durable consumer from its acknowledgement floor (or,
// when it does not exist, from the stream's start) and returns an iterator
// on it. The subscriber must hold the lease: nothing then stays pending
// with a previous owner, to be delivered again only after AckWait, after
// later messages.
func (s *Subscriber) reset(ctx context.Context) (jetstream.MessagesContext, error) {
	s.mu.Lock()
	js := s.js
	s.mu.Unlock()
	stream, durable := s.cfg.Stream.Name, s.cfg.Durable()
	cc := s.cfg.ConsumerConfig()
	from := uint64(1)
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	cons, err := js.Consumer(rctx, stream, durable)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if floor := s.ackFloor.Load(); floor > 0 {
			// Deleted by an earlier reset of this process whose reply
			// was lost (or by an operator): start from the floor it
			// had rather than from the stream's start.
			from = floor + 1
			cc.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
			cc.OptStartSeq = from
		}
	case err != nil:
		return nil, fmt.Errorf("idem: nats: look up consumer %s on stream %s: %w", durable, stream, err)
	default:
		floor := cons.CachedInfo().AckFloor.Stream
		s.ackFloor.Store(max(floor, s.ackFloor.Load()))
		from = floor + 1
		cc.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cc.OptStartSeq = from
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		err := js.DeleteConsumer(rctx, stream, durable)
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("idem: nats: reset consumer %s on stream %s: delete: %w", durable, stream, err)
		}
	}
	rctx, cancel = context.WithTimeout(ctx, requestTimeout)
	cons, err = js.CreateOrUpdateConsumer(rctx, stream, cc)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("idem: nats: create consumer %s on stream %s: %w", durable, stream, err)
	}
	s.log.Debug("nats subscriber: durable consumer reset", "from_stream_seq", from)
	return messages(cons, s.cfg)
}

// becomeActive records and logs that the subscriber owns the durable
// consumer.
func (s *Subscriber) becomeActive() {
	s.active.Store(true)
	s.loggedStandby = false
	s.log.Info("nats subscriber: active: this process owns the durable consumer", "durable", s.cfg.Durable())
}

// standBy records and logs, once per change, that the subscriber stands by.
func (s *Subscriber) standBy(why string) {
	s.active.Store(false)
	if !s.loggedStandby {
		s.loggedStandby = true
		s.log.Info("nats subscriber: standing by: "+why, "durable", s.cfg.Durable(), "owner", s.lease.owner(s.base.WorkContext()), "poll", s.cfg.StandbyPoll)
	}
}

// Stop stops fetching, hands the messages already received to the consumer,
// acknowledges them, releases the durable consumer's lease, closes the
// connection if the subscriber opened it, and returns once all that has
// ended. If ctx ends first, work in progress is abandoned (its messages are
// delivered again to the next owner) and Stop returns ctx's error at once;
// the lease is released and the connection closed in the background, and
// Done is closed once that has ended. Stop is idempotent and safe to call
// from several goroutines.
func (s *Subscriber) Stop(ctx context.Context) error {
	return s.base.Stop(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.iter != nil {
			s.iter.Drain()
		}
	}, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.iter != nil {
			s.iter.Stop()
		}
	})
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

// finish sends the last acknowledgements, releases the lease and closes the
// connection if the subscriber opened it.
func (s *Subscriber) finish() {
	s.mu.Lock()
	nc, owned := s.nc, s.owned
	s.mu.Unlock()
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		s.log.Warn("nats subscriber: flush acknowledgements", "error", err)
	}
	s.active.Store(false)
	s.lease.release(fctx)
	if owned {
		nc.Close()
	}
}

// wait waits for d or until Stop; it reports false on Stop.
func (s *Subscriber) wait(d time.Duration) bool { return ctxsleep.Sleep(s.base.StopContext(), d) }

// run consumes while the subscriber owns the durable consumer and stands by
// otherwise, until Stop. iter is the first term's iterator, nil when Start
// did not get the lease. When an iterator ends on its own (the consumer was
// deleted, the connection closed), run checks that it still holds the lease
// (renewing it) before resetting the consumer and consuming again.
func (s *Subscriber) run(iter jetstream.MessagesContext) {
	defer s.base.Finished()
	defer s.finish()
	work := s.base.WorkContext()
	retry := s.cfg.ReconnectWait
	resumed := false
	for {
		if iter != nil {
			s.mu.Lock()
			s.iter = iter
			if s.stopping() {
				iter.Drain()
			}
			s.mu.Unlock()
			if resumed {
				s.resumeErrs.OK(work) // after failures: "nats subscriber consumption recovered"
			}
			lost := s.term(iter)
			s.mu.Lock()
			s.iter = nil
			s.mu.Unlock()
			iter = nil
			if s.stopping() {
				return
			}
			if lost {
				s.standBy("the lease on the durable consumer was lost (another process took it, or it could not be renewed in time); what this process held is left to the new owner")
				if !s.wait(s.cfg.StandbyPoll) {
					return
				}
			} else if !s.wait(s.cfg.ReconnectWait) {
				return
			}
			retry = s.cfg.ReconnectWait
		}
		actx, cancel := context.WithTimeout(work, requestTimeout)
		held, err := s.lease.acquire(actx)
		cancel()
		if err == nil && held {
			if iter, err = s.reset(work); err == nil {
				if !s.active.Load() {
					s.becomeActive()
				} else {
					s.log.Info("nats subscriber: consuming again")
				}
				resumed = true
				continue
			}
		}
		switch {
		case err != nil:
			s.resumeErrs.Warn(work, "nats subscriber: take or renew the lease and reset the durable consumer", err)
			if !s.wait(retry) {
				return
			}
			retry = min(2*retry, resumeWaitMax)
		default:
			s.standBy("another process owns the durable consumer")
			if !s.wait(s.cfg.StandbyPoll) {
				return
			}
		}
	}
}

// term consumes iter while the lease is held: it renews the lease every
// OwnerTTL/3 and, when that fails, stops the iterator at once and lets the
// workers drop what they hold. It returns when the iterator has ended and
// its messages are settled, and reports whether the lease was lost.
func (s *Subscriber) term(iter jetstream.MessagesContext) bool {
	t := &termState{lost: make(chan struct{}), quit: make(chan struct{})}
	done := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		s.lease.keep(s.base.WorkContext(), done, func() {
			t.markLost()
			s.active.Store(false)
			iter.Stop()
		})
	}()
	go func() {
		select {
		case <-s.base.Stopping():
		case <-t.lost:
		case <-done:
			return
		}
		close(t.quit)
	}()
	s.serve(iter, t)
	close(done)
	<-renewed
	return t.isLost()
}

// termState is one ownership term: lost closes when the lease is lost, quit
// when the workers must give up (lost or stopping).
type termState struct {
	lost     chan struct{}
	quit     chan struct{}
	lostOnce sync.Once
}

func (t *termState) markLost() { t.lostOnce.Do(func() { close(t.lost) }) }

func (t *termState) isLost() bool {
	select {
	case <-t.lost:
		return true
	default:
		return false
	}
}

// serve dispatches the iterator's messages to the workers in batches until
// the iterator closes, then waits for the batches in progress.
func (s *Subscriber) serve(iter jetstream.MessagesContext, t *termState) {
	in := make(chan jetstream.Msg)
	go func() {
		defer close(in)
		var delivered uint64 // the consumer sequence of the last delivery
		for {
			m, err := iter.Next()
			if err != nil {
				if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					return
				}
				if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
					if !t.isLost() {
						s.log.Warn("nats subscriber: consumer gone; recreating it if this process still owns it", "error", err)
					}
					iter.Stop()
					return
				}
				if !s.stopping() {
					s.log.Debug("nats subscriber: fetch", "error", err)
				}
				continue
			}
			if s.dropDelivery != nil && s.dropDelivery(m) {
				continue // a test's lost delivery
			}
			// Every iterator reads a durable consumer just created (reset),
			// whose deliveries to this process are numbered from 1. A gap
			// means a delivery was lost on the way (a slow-consumer drop, a
			// connection or leader change) or taken by another client:
			// JetStream would deliver it again only after AckWait, after
			// the later messages. Stop here, before the later message, and
			// reset the consumer to its acknowledgement floor.
			if md, err := m.Metadata(); err == nil {
				if md.Sequence.Consumer != delivered+1 {
					s.log.Warn("nats subscriber: a delivery was lost on the way; resetting the durable consumer to its acknowledgement floor to keep the order",
						"expected_delivery", delivered+1, "got_delivery", md.Sequence.Consumer, "stream_seq", md.Sequence.Stream)
					s.gaps.Add(1)
					iter.Stop()
					return
				}
				delivered = md.Sequence.Consumer
			}
			in <- m
		}
	}()

	n := s.cfg.Workers
	batch.Dispatch(in, n, s.cfg.BatchSize, s.cfg.BatchLinger,
		func(m jetstream.Msg) int { return s.worker(m, n) },
		func(_ int, batches <-chan []jetstream.Msg) {
			w := batch.NewWorker[jetstream.Msg](msgTransport{s, t}, batch.WorkerConfig{
				Deliver: func(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
					return s.deliverBatch(ctx, ds, t)
				},
				Context:      s.base.WorkContext(),
				RequeueDelay: s.cfg.RequeueDelay,
				TouchEvery:   s.cfg.AckWait / 3,
				Logger:       s.log,
				OnHeld:       func(n int) { s.held.Add(int64(n)) },
			})
			w.Run(batches, t.quit)
		})
}

// Held returns the number of messages held unacknowledged while they, or an
// earlier message of their aggregate, wait for a retry or the end of a
// pause.
func (s *Subscriber) Held() int { return int(s.held.Load()) }

// worker picks the worker of m: by key (orderKey), so one aggregate's
// messages stay in order, else by event id.
func (s *Subscriber) worker(m jetstream.Msg, n int) int {
	if n == 1 {
		return 0
	}
	h := m.Headers()
	key := orderKey(h)
	if key == "" {
		key = h.Get(idem.HeaderEventID)
	}
	return int(maphash.String(s.seed, key) % uint64(n))
}

// errNotOwner is the error of the messages a subscriber that lost its
// lease does not hand to the consumer.
var errNotOwner = errors.New("idem: nats: this process no longer owns the durable consumer; the message is left to its new owner")

// deliverBatch hands a batch to the consumer, unless the lease is lost or
// has run out unrenewed, then hits the fault point between the consumer's
// commit and the acknowledgements.
func (s *Subscriber) deliverBatch(ctx context.Context, ds []broker.Delivery, t *termState) ([]broker.Disposition, []error) {
	if t.isLost() || !s.lease.valid() {
		errs := make([]error, len(ds))
		for i := range errs {
			errs[i] = errNotOwner
		}
		return make([]broker.Disposition, len(ds)), errs
	}
	disps, errs := s.deliver(ctx, ds)
	fault.Point(fault.NATSAfterHandleBeforeAck)
	return disps, errs
}

// msgTransport settles JetStream messages for batch.Worker, in one
// ownership term.
type msgTransport struct {
	s *Subscriber
	t *termState
}

func (t msgTransport) Key(m jetstream.Msg) string { return orderKey(m.Headers()) }

// orderKey returns what orders a message among those of its aggregate: the
// key header, else, on a binary CloudEvent another program published, its
// subject attribute as sent (idem's publishers set the key header).
func orderKey(h nats.Header) string {
	if k := h.Get(HeaderKey); k != "" {
		return k
	}
	return h.Get("ce-subject")
}

func (t msgTransport) Delivery(m jetstream.Msg, attempt int) broker.Delivery {
	d := t.s.toDelivery(m)
	d.Attempt += attempt - 1
	return d
}

func (t msgTransport) Ack(ms []jetstream.Msg) {
	for _, m := range ms {
		if err := m.Ack(); err != nil {
			// The message comes back after AckWait and is deduplicated.
			t.s.ackErrs.Warn(t.s.base.WorkContext(), "nats subscriber: acknowledge message", err)
			continue
		}
		t.s.ackErrs.OK(t.s.base.WorkContext())
	}
}

func (t msgTransport) Release(ms []jetstream.Msg) {
	if t.t.isLost() {
		return // the new owner has them delivered again, in order
	}
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
	return broker.Delivery{Message: msg, Source: s.cfg.Durable(), Attempt: attempt, System: broker.SystemNATS}
}

var (
	_ broker.Subscriber  = (*Subscriber)(nil)
	_ broker.Redeliverer = (*Publisher)(nil)
	_ broker.Describer   = (*Publisher)(nil)
)
