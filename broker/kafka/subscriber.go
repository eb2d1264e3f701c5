package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/startstop"
)

// Subscriber defaults.
const (
	// BatchSizeDefault is the most records of one partition given to the
	// consumer at once.
	BatchSizeDefault = 100
	// RequeueDelayDefault is how long a partition waits before it tries
	// again records that could be neither handled nor parked.
	RequeueDelayDefault = time.Second
	// DeadLetterAfterDefault is the attempt after which a failing record goes
	// to the dead-letter topic, when one is configured.
	DeadLetterAfterDefault = 3
	// MaxBufferedDefault is how many fetched records a partition may hold
	// before its fetching pauses.
	MaxBufferedDefault = 5000
	// DeadLetterSuffixDefault is appended to a record's topic to name its
	// dead-letter topic.
	DeadLetterSuffixDefault = ".dlq"
)

// Headers a Subscriber adds to records it writes to a dead-letter topic.
const (
	HeaderDLQError     = "idem-error"
	HeaderDLQTopic     = "idem-source-topic"
	HeaderDLQPartition = "idem-source-partition"
	HeaderDLQOffset    = "idem-source-offset"
	HeaderDLQAttempts  = "idem-attempts"
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	ClientConfig
	// Group is the consumer group, one per consuming service (for example
	// "stock"). Required.
	Group string
	// Topics are the topics consumed, for example "outbox.event.order".
	// Required.
	Topics []string
	// TopicPrefix is stripped from a topic name to find the aggregate type of
	// records that carry none in their value (Debezium's bare payloads).
	// Defaults to "outbox.event.".
	TopicPrefix string
	// BatchSize is the most records of one partition given to the consumer
	// at once, in one transaction. A batch never holds two records with the
	// same key, so that a failing record is never followed by a later event
	// of its aggregate in the same call. Defaults to 100.
	BatchSize int
	// MaxBuffered is how many fetched records a partition may hold before
	// fetching it pauses (while the partition waits on a failing record, for
	// instance). Pausing and resuming cost a fetch round, so keep it well
	// above BatchSize. Defaults to 5000 (at least BatchSize).
	MaxBuffered int
	// RequeueDelay is how long a partition waits before trying again records
	// that could be neither handled nor parked (the database is down).
	// Defaults to 1s.
	RequeueDelay time.Duration
	// DeadLetter turns the dead-letter topic on: a record the consumer still
	// asks to retry after DeadLetterAfter attempts is produced, with its
	// headers and the error, to its dead-letter topic, and the partition moves
	// on once the copy is acknowledged. Records the consumer parks itself
	// (undecodable, permanent errors) stay in its failure store.
	DeadLetter bool
	// DeadLetterTopic names the dead-letter topic of every record. Defaults
	// to the record's topic followed by ".dlq".
	DeadLetterTopic string
	// DeadLetterAfter is the number of attempts after which a failing record
	// goes to the dead-letter topic. Keep it below the consumer's
	// RetryPolicy.MaxAttempts(), or the consumer parks the record in its
	// failure store first. Defaults to 3.
	DeadLetterAfter int
	// DefaultEventNames gives, per topic, the event name of records that
	// carry none (no "eventType" header: Debezium's Event Router without
	// table.fields.additional.placement=type:header:eventType). A record
	// without an event name and without a default is parked by the consumer
	// as undecodable, never dropped.
	DefaultEventNames map[string]string
	// ObserveDelay, when set, is called for every handled record with the
	// time from the event's occurrence (its outbox commit) to the end of its
	// handling. It must be fast and safe for concurrent use.
	ObserveDelay func(time.Duration)
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SubscriberConfig) WithDefaults() SubscriberConfig {
	c.ClientConfig = c.ClientConfig.withDefaults()
	if c.TopicPrefix == "" {
		c.TopicPrefix = TopicPrefixDefault
	}
	if c.BatchSize == 0 {
		c.BatchSize = BatchSizeDefault
	}
	if c.MaxBuffered == 0 {
		c.MaxBuffered = max(MaxBufferedDefault, c.BatchSize)
	}
	if c.RequeueDelay == 0 {
		c.RequeueDelay = RequeueDelayDefault
	}
	if c.DeadLetterAfter == 0 {
		c.DeadLetterAfter = DeadLetterAfterDefault
	}
	return c
}

func (c SubscriberConfig) validate() error {
	if err := c.ClientConfig.validate("SubscriberConfig"); err != nil {
		return err
	}
	switch {
	case c.Group == "":
		return errors.New("idem: kafka: SubscriberConfig.Group is required (one consumer group per consuming service, e.g. \"stock\")")
	case len(c.Topics) == 0:
		return errors.New("idem: kafka: SubscriberConfig.Topics is required (e.g. \"outbox.event.order\")")
	case c.BatchSize < 1:
		return fmt.Errorf("idem: kafka: SubscriberConfig.BatchSize %d: want at least 1", c.BatchSize)
	case c.MaxBuffered < c.BatchSize:
		return fmt.Errorf("idem: kafka: SubscriberConfig.MaxBuffered %d: want at least BatchSize (%d)", c.MaxBuffered, c.BatchSize)
	case c.RequeueDelay < 0:
		return fmt.Errorf("idem: kafka: SubscriberConfig.RequeueDelay %v is negative", c.RequeueDelay)
	case c.DeadLetterAfter < 1:
		return fmt.Errorf("idem: kafka: SubscriberConfig.DeadLetterAfter %d: want at least 1", c.DeadLetterAfter)
	case c.DeadLetterTopic != "" && !validTopic(c.DeadLetterTopic):
		return fmt.Errorf("idem: kafka: SubscriberConfig.DeadLetterTopic %q is not a valid topic name", c.DeadLetterTopic)
	}
	for _, t := range c.Topics {
		if !validTopic(t) {
			return fmt.Errorf("idem: kafka: SubscriberConfig.Topics: %q is not a valid topic name", t)
		}
	}
	return nil
}

// Subscriber consumes topics in a consumer group and feeds an idempotent
// consumer.
//
// Each assigned partition has its own goroutine, which hands the partition's
// records, in offset order, to the DeliverFunc in batches. Partitions are
// processed in parallel. Offsets are committed only after the DeliverFunc
// returned, that is after the consumer's database transaction committed, and
// only up to the last record of an unbroken run of records that were handled
// or parked: the committed offset never passes a record that is not (G5). A
// process that dies between the two commits gets the records again, and the
// consumer skips them as duplicates.
//
// A record the consumer asks to retry is retried in place, after the delay it
// asks for, with its attempt increased: the partition waits, because the
// order of its records matters. When the consumer's retry policy runs out it
// parks the record in its failure store (or, with DeadLetter, the subscriber
// sends it to a dead-letter topic) and the partition moves on. The consumer
// counts failed attempts in its database, so a record retried across a
// restart or a rebalance keeps its count. When the consumer pauses (its
// database or a dependency is away), the partition waits the pause and
// delivers the same records again: no attempt is counted, nothing is
// parked, and the offset stays where it is.
//
// When partitions are revoked by a rebalance, or at Stop, their goroutines
// finish the batch in progress (retry waits are abandoned) and what is done is
// committed before the partitions are given up.
type Subscriber struct {
	cfg     SubscriberConfig
	deliver broker.DeliverFunc
	log     *slog.Logger
	cl      *kgo.Client
	// fetchErrs and commitErrs log the failures of fetches and offset
	// commits.
	fetchErrs, commitErrs *errlog.Limiter

	// base is the lifecycle. Its WorkContext is given to the DeliverFunc:
	// it is canceled only when Stop runs out of time. Its StopContext ends
	// the polls and the commits of the running subscriber at Stop.
	base startstop.Base

	mu        sync.Mutex
	accepting bool // partitions get goroutines: started, not stopping
	workers   map[tp]*partWorker
	wg        sync.WaitGroup // partition goroutines
	loops     sync.WaitGroup // poll loop and committer
	stopErr   error          // the last commit's, at Stop

	commitMu   sync.Mutex // serializes commits
	dirtyMu    sync.Mutex
	dirty      map[tp]kgo.EpochOffset
	commitWake chan struct{}
	commitStop chan struct{}

	st subStats
}

type tp struct {
	topic     string
	partition int32
}

// NewSubscriber returns a subscriber that hands what it receives to deliver,
// typically consumer.DeliverBatch.
func NewSubscriber(cfg SubscriberConfig, deliver broker.DeliverFunc) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deliver == nil {
		return nil, errors.New("idem: kafka: NewSubscriber: deliver is nil")
	}
	s := &Subscriber{
		cfg:        cfg,
		deliver:    deliver,
		log:        cfg.Logger.With("group", cfg.Group),
		workers:    map[tp]*partWorker{},
		dirty:      map[tp]kgo.EpochOffset{},
		commitWake: make(chan struct{}, 1),
		commitStop: make(chan struct{}),
	}
	s.fetchErrs = errlog.New(s.log, "kafka fetches", errlog.Config{})
	s.commitErrs = errlog.New(s.log, "kafka offset commits", errlog.Config{})
	s.st.init()
	return s, nil
}

// Start joins the group and starts consuming. ctx bounds the start-up only
// (reaching a broker); the subscriber then runs until Stop. It returns an
// error if no broker can be reached; a Stop during Start interrupts it.
func (s *Subscriber) Start(ctx context.Context) error {
	if err := s.base.Starting(); err != nil {
		if errors.Is(err, startstop.ErrStopped) {
			return fmt.Errorf("%w: %w", ErrClosed, err)
		}
		return fmt.Errorf("idem: kafka: subscriber: %w", err)
	}
	opts := s.cfg.opts()
	opts = append(opts,
		kgo.ProducerLinger(0),         // dead-letter copies are waited for one by one
		kgo.FetchMaxWait(time.Second), // a resumed partition waits at most this for the fetch in flight
	)
	opts = append(opts, s.cfg.Opts...)
	opts = append(opts,
		kgo.ConsumerGroup(s.cfg.Group),
		kgo.ConsumeTopics(s.cfg.Topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		s.base.StartFailed()
		return fmt.Errorf("idem: kafka: new subscriber: %w", err)
	}
	ctx, cancel := s.base.StartContext(ctx)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		cl.Close()
		s.base.StartFailed()
		return fmt.Errorf("idem: kafka: subscriber %s: reach brokers %v: %w", s.cfg.Group, s.cfg.Brokers, err)
	}
	s.mu.Lock()
	s.cl = cl
	s.accepting = true
	s.mu.Unlock()
	s.loops.Add(2)
	go s.pollLoop()
	go s.committer()
	go s.finishAtStop()
	s.base.Running() // a Stop during the start-up is seen by finishAtStop
	return nil
}

// Stop stops fetching, lets every partition finish the batch in progress,
// commits what is done, leaves the group, and returns once all that has
// ended, with the final commit's error if it failed. If ctx ends first,
// batches in progress are canceled (their transactions roll back) and Stop
// returns ctx's error at once; the subscriber commits what is done and
// leaves the group in the background, and Done is closed once it has. Stop
// is idempotent and safe to call from several goroutines.
func (s *Subscriber) Stop(ctx context.Context) error {
	if err := s.base.Stop(ctx, nil, nil); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopErr
}

// finishAtStop waits for Stop, then stops the partitions, commits what they
// did, and leaves the group.
func (s *Subscriber) finishAtStop() {
	<-s.base.Stopping()
	s.mu.Lock()
	s.accepting = false
	s.mu.Unlock()
	s.stopAll()
	s.loops.Wait()
	// The partitions' goroutines are gone: commit what is done, then leave.
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := s.commitNow(cctx, nil)
	cancel()
	close(s.commitStop)
	s.cl.Close()
	s.mu.Lock()
	s.stopErr = err
	s.mu.Unlock()
	s.base.Finished()
}

// stopAll stops every partition goroutine and waits for them.
func (s *Subscriber) stopAll() {
	s.mu.Lock()
	for k, w := range s.workers {
		w.halt()
		delete(s.workers, k)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Client returns the underlying franz-go client (nil before Start), for
// administration. Do not close it or consume with it.
func (s *Subscriber) Client() *kgo.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cl
}

func (s *Subscriber) pollLoop() {
	defer s.loops.Done()
	stop := s.base.StopContext()
	for {
		fetches := s.cl.PollRecords(stop, 10*s.cfg.BatchSize)
		if fetches.IsClientClosed() || stop.Err() != nil {
			s.cl.AllowRebalance()
			return
		}
		failed := false
		fetches.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			failed = true
			s.fetchErrs.Warn(stop, "kafka fetch error", err, "topic", topic, "partition", p)
		})
		if !failed {
			s.fetchErrs.OK(stop)
		}
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 && p.HighWatermark <= 0 {
				return
			}
			w := s.worker(tp{p.Topic, p.Partition})
			if w == nil {
				return
			}
			s.st.mu.Lock()
			s.st.hwm[w.tp] = p.HighWatermark
			s.st.mu.Unlock()
			if len(p.Records) > 0 && w.push(p.Records) >= s.cfg.MaxBuffered {
				w.pause(s.cl)
			}
		})
		s.cl.AllowRebalance()
	}
}

// worker returns the goroutine of partition k, starting it if needed.
func (s *Subscriber) worker(k tp) *partWorker {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.accepting {
		return nil
	}
	w := s.workers[k]
	if w == nil {
		w = newPartWorker(k)
		s.workers[k] = w
		s.wg.Add(1)
		go s.runWorker(w)
	}
	return w
}

func (s *Subscriber) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	for topic, ps := range assigned {
		for _, p := range ps {
			s.worker(tp{topic, p})
		}
	}
}

// onRevoked finishes the work in progress on the revoked partitions and
// commits it before they are given up.
func (s *Subscriber) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	ws := s.detach(revoked)
	for _, w := range ws {
		<-w.done
	}
	keys := make([]tp, 0, len(ws))
	for _, w := range ws {
		keys = append(keys, w.tp)
	}
	if len(keys) > 0 {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := s.commitNow(cctx, keys); err != nil {
			s.log.Warn("kafka commit of revoked partitions failed; their last records will be delivered again", "error", err)
		}
		cancel()
	}
	s.resume(cl, ws)
}

// onLost abandons lost partitions: another member may own them already, so
// nothing is committed for them.
func (s *Subscriber) onLost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	ws := s.detach(lost)
	for _, w := range ws {
		<-w.done
	}
	s.dirtyMu.Lock()
	for _, w := range ws {
		delete(s.dirty, w.tp)
	}
	s.dirtyMu.Unlock()
	s.resume(cl, ws)
}

// detach removes the goroutines of the given partitions and tells them to
// stop after the batch in progress.
func (s *Subscriber) detach(parts map[string][]int32) []*partWorker {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ws []*partWorker
	for topic, ps := range parts {
		for _, p := range ps {
			k := tp{topic, p}
			if w := s.workers[k]; w != nil {
				w.halt()
				delete(s.workers, k)
				ws = append(ws, w)
			}
		}
	}
	return ws
}

func (s *Subscriber) resume(cl *kgo.Client, ws []*partWorker) {
	m := map[string][]int32{}
	for _, w := range ws {
		if w.paused.Load() {
			m[w.topic] = append(m[w.topic], w.partition)
		}
	}
	if len(m) > 0 {
		cl.ResumeFetchPartitions(m)
	}
}

// markDone records that everything before off is handled or parked, and
// wakes the committer.
func (s *Subscriber) markDone(k tp, off kgo.EpochOffset) {
	s.dirtyMu.Lock()
	if cur, ok := s.dirty[k]; !ok || cur.Offset < off.Offset {
		s.dirty[k] = off
	}
	s.dirtyMu.Unlock()
	select {
	case s.commitWake <- struct{}{}:
	default:
	}
}

func (s *Subscriber) committer() {
	defer s.loops.Done()
	stop := s.base.StopContext()
	for {
		select {
		case <-s.commitWake:
		case <-stop.Done():
			return
		}
		ctx, cancel := context.WithTimeout(stop, 10*time.Second)
		err := s.commitNow(ctx, nil)
		cancel()
		if err == nil {
			s.commitErrs.OK(stop)
		}
		if err != nil && stop.Err() == nil {
			s.commitErrs.Warn(stop, "kafka offset commit failed; retrying", err)
			if !ctxsleep.Sleep(stop, 100*time.Millisecond) {
				return
			}
			select {
			case s.commitWake <- struct{}{}:
			default:
			}
		}
	}
}

// commitNow commits the pending offsets of keys (all partitions if keys is
// nil) and waits for the result.
func (s *Subscriber) commitNow(ctx context.Context, keys []tp) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.dirtyMu.Lock()
	take := map[tp]kgo.EpochOffset{}
	if keys == nil {
		for k, v := range s.dirty {
			take[k] = v
		}
		clear(s.dirty)
	} else {
		for _, k := range keys {
			if v, ok := s.dirty[k]; ok {
				take[k] = v
				delete(s.dirty, k)
			}
		}
	}
	s.dirtyMu.Unlock()
	if len(take) == 0 {
		return nil
	}
	req := map[string]map[int32]kgo.EpochOffset{}
	for k, v := range take {
		if req[k.topic] == nil {
			req[k.topic] = map[int32]kgo.EpochOffset{}
		}
		req[k.topic][k.partition] = v
	}
	var failed error
	s.cl.CommitOffsetsSync(ctx, req, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			failed = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				k := tp{t.Topic, p.Partition}
				if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
					failed = fmt.Errorf("commit %s/%d: %w", t.Topic, p.Partition, perr)
					continue
				}
				s.st.committedAt(k, take[k].Offset)
				delete(take, k)
			}
		}
	})
	if failed != nil || len(take) > 0 {
		s.st.commitErrors.Add(1)
		// Put back what was not committed, unless newer offsets are pending.
		s.dirtyMu.Lock()
		for k, v := range take {
			if cur, ok := s.dirty[k]; !ok || cur.Offset < v.Offset {
				s.dirty[k] = v
			}
		}
		s.dirtyMu.Unlock()
		if failed == nil {
			failed = errors.New("commit response is missing partitions")
		}
		return fmt.Errorf("idem: kafka: commit offsets of group %s: %w", s.cfg.Group, failed)
	}
	s.st.commits.Add(1)
	return nil
}

// runWorker processes one partition until it is revoked or the subscriber
// stops.
func (s *Subscriber) runWorker(w *partWorker) {
	defer s.wg.Done()
	defer close(w.done)
	for {
		batch := w.next(s.cfg.BatchSize)
		if batch == nil {
			return
		}
		if w.paused.Load() && w.buffered() <= s.cfg.MaxBuffered/2 {
			w.resume(s.cl)
		}
		if !s.handle(w, batch) {
			return
		}
	}
}

// handle delivers batch until every record is handled or parked, committing
// progress as it goes. It returns false if the partition was stopped first.
func (s *Subscriber) handle(w *partWorker, batch []*kgo.Record) bool {
	n := len(batch)
	done := make([]bool, n)
	attempts := make([]int, n)
	for i := range attempts {
		attempts[i] = 1
	}
	pending := make([]int, n)
	for i := range pending {
		pending[i] = i
	}
	prefix := 0 // records batch[:prefix] are done
	ds := make([]broker.Delivery, 0, n)
	for {
		ds = ds[:0]
		for _, i := range pending {
			ds = append(ds, s.delivery(batch[i], attempts[i]))
		}
		disps, errs := s.deliver(s.base.WorkContext(), ds)
		now := time.Now()
		var wait time.Duration
		for k, i := range pending {
			var disp broker.Disposition
			var err error
			if k < len(disps) {
				disp = disps[k]
			}
			if k < len(errs) {
				err = errs[k]
			} else if k >= len(disps) {
				err = errors.New("DeliverFunc returned fewer dispositions than deliveries")
			}
			switch {
			case err != nil:
				s.st.requeued.Add(1)
				s.log.Warn("kafka record neither handled nor parked; the partition waits", "source", ds[k].Source,
					"offset", batch[i].Offset, "error", err)
				wait = max(wait, s.cfg.RequeueDelay)
			case disp.Action == broker.Ack:
				done[i] = true
				if disp.Outcome == broker.Parked {
					s.st.parked.Add(1)
				} else {
					s.st.handled.Add(1)
				}
				s.observe(now, batch[i], disp)
			case disp.Action == broker.Retry && s.cfg.DeadLetter && max(attempts[i], disp.Attempts) >= s.cfg.DeadLetterAfter:
				if derr := s.deadLetter(batch[i], max(attempts[i], disp.Attempts), disp.Err); derr != nil {
					s.log.Warn("kafka dead-letter produce failed; the partition waits", "offset", batch[i].Offset, "error", derr)
					wait = max(wait, s.cfg.RequeueDelay)
				} else {
					done[i] = true
					s.st.deadLettered.Add(1)
				}
			case disp.Action == broker.Retry:
				if disp.Outcome != broker.Deferred {
					attempts[i]++
					s.st.retries.Add(1)
				}
				wait = max(wait, disp.RetryAfter)
			case disp.Action == broker.Pause:
				s.st.paused.Add(1)
				wait = max(wait, disp.RetryAfter)
			default:
				s.log.Warn("kafka record got an unknown disposition; the partition waits", "action", disp.Action)
				wait = max(wait, s.cfg.RequeueDelay)
			}
		}
		old := prefix
		for prefix < n && done[prefix] {
			prefix++
		}
		if prefix > old {
			fault.Point(fault.KafkaAfterHandleBeforeCommit)
			last := batch[prefix-1]
			s.markDone(w.tp, kgo.EpochOffset{Epoch: last.LeaderEpoch, Offset: last.Offset + 1})
		}
		if prefix == n {
			w.failing.Store(false)
			return true
		}
		pending = pending[:0]
		for i := prefix; i < n; i++ {
			if !done[i] {
				pending = append(pending, i)
			}
		}
		w.failing.Store(true)
		if !w.sleep(wait) {
			return false
		}
	}
}

func (s *Subscriber) observe(now time.Time, r *kgo.Record, disp broker.Disposition) {
	at := disp.Event.OccurredAt
	if at.IsZero() {
		at = r.Timestamp
	}
	if at.IsZero() {
		return
	}
	d := now.Sub(at)
	if d < 0 {
		d = 0
	}
	s.st.delay.observe(d)
	if s.cfg.ObserveDelay != nil {
		s.cfg.ObserveDelay(d)
	}
}

// delivery turns a record into an inbox delivery.
func (s *Subscriber) delivery(r *kgo.Record, attempt int) broker.Delivery {
	var headers map[string]string
	if len(r.Headers) > 0 {
		headers = make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			headers[h.Key] = string(h.Value)
		}
	}
	m := idem.Message{Key: r.Key, Headers: headers, Body: r.Value}
	if id := headers[idem.HeaderEventID]; id != "" {
		if u, err := uuid.Parse(id); err == nil {
			m.EventID = u
		}
	}
	m.EventName = headers[idem.HeaderEventType]
	if m.EventName == "" {
		m.EventName = s.cfg.DefaultEventNames[r.Topic]
	}
	if at, ok := strings.CutPrefix(r.Topic, s.cfg.TopicPrefix); ok {
		m.AggregateType = at
	}
	return broker.Delivery{
		Message: m,
		Source:  r.Topic + "/" + strconv.Itoa(int(r.Partition)),
		Attempt: attempt,
		System:  broker.SystemKafka,
	}
}

// deadLetter produces r to its dead-letter topic and waits for the ack.
func (s *Subscriber) deadLetter(r *kgo.Record, attempts int, cause error) error {
	topic := s.cfg.DeadLetterTopic
	if topic == "" {
		topic = r.Topic + DeadLetterSuffixDefault
	}
	msg := "unknown error"
	if cause != nil {
		msg = cause.Error()
	}
	headers := append([]kgo.RecordHeader(nil), r.Headers...)
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderDLQError, Value: []byte(msg)},
		kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		kgo.RecordHeader{Key: HeaderDLQAttempts, Value: []byte(strconv.Itoa(attempts))},
	)
	ctx, cancel := context.WithTimeout(s.base.WorkContext(), 30*time.Second)
	defer cancel()
	rec := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: headers}
	if err := s.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("idem: kafka: produce to dead-letter topic %s: %w", topic, err)
	}
	s.log.Warn("kafka record sent to dead-letter topic", "topic", topic, "source", r.Topic, "partition", r.Partition,
		"offset", r.Offset, "attempts", attempts, "error", msg)
	return nil
}

// partWorker is the state of one assigned partition.
type partWorker struct {
	tp
	mu    sync.Mutex
	queue []*kgo.Record
	wake  chan struct{}
	stop  context.Context // ends when the partition is stopped (halt)
	halt  context.CancelFunc
	done  chan struct{}

	paused  atomic.Bool
	failing atomic.Bool
	nbuf    atomic.Int64
}

func newPartWorker(k tp) *partWorker {
	w := &partWorker{tp: k, wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.stop, w.halt = context.WithCancel(context.Background())
	return w
}

// push appends records and returns how many are buffered.
func (w *partWorker) push(rs []*kgo.Record) int {
	w.mu.Lock()
	w.queue = append(w.queue, rs...)
	n := len(w.queue)
	w.mu.Unlock()
	w.nbuf.Store(int64(n))
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return n
}

func (w *partWorker) buffered() int { return int(w.nbuf.Load()) }

// next waits for records and returns up to max of them, stopping before the
// first record whose key is already in the batch. It returns nil once the
// partition is stopped.
func (w *partWorker) next(max int) []*kgo.Record {
	for {
		select {
		case <-w.stop.Done():
			return nil
		default:
		}
		w.mu.Lock()
		if len(w.queue) > 0 {
			n := 0
			var keys map[string]struct{}
			for n < len(w.queue) && n < max {
				k := w.queue[n].Key
				if k != nil {
					if keys == nil {
						keys = make(map[string]struct{}, max)
					}
					if _, dup := keys[string(k)]; dup {
						break
					}
					keys[string(k)] = struct{}{}
				}
				n++
			}
			batch := make([]*kgo.Record, n)
			copy(batch, w.queue[:n])
			clear(w.queue[:n])
			w.queue = w.queue[n:]
			w.nbuf.Store(int64(len(w.queue)))
			w.mu.Unlock()
			return batch
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-w.stop.Done():
			return nil
		}
	}
}

// sleep waits d and reports false if the partition was stopped meanwhile.
func (w *partWorker) sleep(d time.Duration) bool { return ctxsleep.Sleep(w.stop, d) }

func (w *partWorker) pause(cl *kgo.Client) {
	if w.paused.CompareAndSwap(false, true) {
		cl.PauseFetchPartitions(map[string][]int32{w.topic: {w.partition}})
	}
}

func (w *partWorker) resume(cl *kgo.Client) {
	if w.paused.CompareAndSwap(true, false) {
		cl.ResumeFetchPartitions(map[string][]int32{w.topic: {w.partition}})
	}
}

var (
	_ broker.Subscriber  = (*Subscriber)(nil)
	_ broker.Redeliverer = (*Publisher)(nil)
	_ broker.Describer   = (*Publisher)(nil)
)

// Done is closed when a started subscriber has stopped.
func (s *Subscriber) Done() <-chan struct{} { return s.base.Done() }
