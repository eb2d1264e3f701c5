package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/ctxsleep"
)

// Publisher defaults.
const (
	// MaxInFlightDefault is how many messages one Publish call has sent and
	// not yet seen acknowledged at most.
	MaxInFlightDefault = 4096
	// AckTimeoutDefault bounds the wait for one message's PubAck.
	AckTimeoutDefault = 30 * time.Second
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	ConnConfig
	// Stream is the stream events are published to. It is created, or
	// updated to this configuration, by NewPublisher unless NoDeclare is set.
	Stream StreamConfig
	// NoDeclare skips creating or updating the stream, which must then
	// exist.
	NoDeclare bool
	// PartitionsFromStream takes the partition count from the stream's
	// metadata (idem_partitions) instead of Stream.Partitions, when the
	// stream exists: for tools that inspect a stream whatever its count
	// ("idem status"). Publishers of one stream should rather all be
	// configured with its count, which is then checked.
	PartitionsFromStream bool
	// MaxInFlight is how many messages of one Publish call are sent ahead
	// of their acknowledgements. Defaults to 4096.
	MaxInFlight int
	// AckTimeout bounds the wait for each message's acknowledgement by
	// JetStream. Defaults to 30s.
	AckTimeout time.Duration
	// CloudEvents, when set, publishes CloudEvents 1.0 instead of idem's
	// envelope, as idem.CloudEventsNATS says (the NATS protocol binding,
	// NATS 2.2 and later): in binary content mode, the payload as the
	// data and every attribute, datacontenttype included, in a header
	// "ce-<name>" with its value percent-encoded; in structured content
	// mode, the JSON event format as the data with "Content-Type:
	// application/cloudevents+json". The subject, Nats-Msg-Id and idem's
	// headers are as with the envelope. Redeliver sends stored messages as
	// they are.
	CloudEvents *idem.CloudEvents
}

// WithDefaults returns c with zero fields set to their defaults.
func (c PublisherConfig) WithDefaults() PublisherConfig {
	c.ConnConfig = c.ConnConfig.withDefaults()
	c.Stream = c.Stream.WithDefaults()
	c.MaxInFlight = cmp.Or(c.MaxInFlight, MaxInFlightDefault)
	c.AckTimeout = cmp.Or(c.AckTimeout, AckTimeoutDefault)
	return c
}

func (c PublisherConfig) validate() error {
	if err := c.ConnConfig.validate("PublisherConfig"); err != nil {
		return err
	}
	if err := c.Stream.validate("PublisherConfig"); err != nil {
		return err
	}
	if c.MaxInFlight < 1 {
		return fmt.Errorf("idem: nats: PublisherConfig.MaxInFlight %d: want at least 1", c.MaxInFlight)
	}
	if c.AckTimeout < 0 {
		return fmt.Errorf("idem: nats: PublisherConfig.AckTimeout %v is negative", c.AckTimeout)
	}
	if c.CloudEvents != nil {
		if err := c.CloudEvents.Validate(); err != nil {
			return fmt.Errorf("idem: nats: PublisherConfig.CloudEvents: %w", err)
		}
	}
	return nil
}

// ErrClosed is returned by a Publisher used after Close.
var ErrClosed = errors.New("idem: nats: closed")

// Publisher publishes idem messages to a JetStream stream: subject
// <prefix>.<event name> (<prefix>-p.<partition>.<event name> when the
// stream is partitioned, see StreamConfig.Partitions), Nats-Msg-Id = event id, headers "id" (event id),
// "eventType" (event name), idem-key (aggregate id) and the message's own
// headers. It sends many messages ahead (asynchronous publish) and waits for
// every acknowledgement, so one call reports one result per message. It
// implements broker.Publisher and is safe for concurrent use.
//
// JetStream drops a message whose Nats-Msg-Id it stored within the stream's
// duplicate window (and acknowledges it): a relay that publishes a row again
// after a crash costs nothing downstream. The consumer's deduplication stays
// the guarantee; the window is a first line only.
//
// The connection reconnects forever after a loss; messages sent while
// disconnected are buffered by the client and resent.
type Publisher struct {
	cfg   PublisherConfig
	nc    *nats.Conn
	owned bool
	js    jetstream.JetStream

	mu     sync.RWMutex
	closed bool
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher connects, checks that the stream's partition count (if the
// stream exists) is cfg.Stream.Partitions (ErrPartitions otherwise), and
// creates or updates the stream (unless cfg.NoDeclare).
func NewPublisher(ctx context.Context, cfg PublisherConfig) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	nc, owned, err := cfg.connect()
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(4*cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		if owned {
			nc.Close()
		}
		return nil, fmt.Errorf("idem: nats: %w", err)
	}
	if cfg.Stream, err = ensureStream(ctx, js, cfg.Stream, "PublisherConfig", !cfg.NoDeclare, cfg.PartitionsFromStream, cfg.Logger); err != nil {
		if owned {
			nc.Close()
		}
		return nil, err
	}
	return &Publisher{cfg: cfg, nc: nc, owned: owned, js: js}, nil
}

// Close waits for the Publish calls in progress (each bounded by its context
// and AckTimeout), makes later calls fail with ErrClosed, and closes the
// connection if the publisher opened it. Close is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.owned {
		// Closing the connection ends the jetstream publisher's goroutines
		// too. CleanupPublisher first would race with the one that
		// watches reconnections (nats.go v1.55: it may read the status
		// channel after CleanupPublisher set it to nil, and then wait on
		// a nil channel for ever).
		p.nc.Close()
		return nil
	}
	p.js.CleanupPublisher()
	return nil
}

// Conn returns the publisher's connection.
func (p *Publisher) Conn() *nats.Conn { return p.nc }

// Publish implements broker.Publisher: it publishes each message on
// <prefix>.<event name> (or, partitioned, on
// <prefix>-p.<partition of its key>.<event name>) and waits for every
// acknowledgement. A message
// whose subject no stream captures fails with an error wrapping
// broker.ErrUnroutable; an event name with whitespace or wildcards fails
// without being sent.
func (p *Publisher) Publish(ctx context.Context, msgs []idem.Message) error {
	outs := make([]*nats.Msg, len(msgs))
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		subject, err := p.subject(m)
		if err != nil {
			errs[i] = err
			continue
		}
		if p.cfg.CloudEvents != nil {
			ce, err := p.cfg.CloudEvents.Encode(m, idem.CloudEventsNATS)
			if err != nil {
				errs[i] = fmt.Errorf("idem: nats: message %s: %w", m.EventID, err)
				continue
			}
			m = ce
		}
		outs[i] = natsMsg(subject, m, m.EventID.String())
	}
	return p.publish(ctx, outs, errs)
}

// MessagingSystem implements broker.Describer: "nats".
func (p *Publisher) MessagingSystem() string { return broker.SystemNATS }

// Destination implements broker.Describer: the subject m is published on, ""
// when its event name cannot be one.
func (p *Publisher) Destination(m idem.Message) string {
	subject, _ := p.subject(m)
	return subject
}

// subject returns the subject m is published on.
func (p *Publisher) subject(m idem.Message) (string, error) {
	if p.cfg.Stream.Partitions > 0 {
		return p.cfg.Stream.PartitionSubject(p.cfg.Stream.Partition(m.Key), m.EventName)
	}
	return p.cfg.Stream.Subject(m.EventName)
}

// Redeliver publishes msgs for one consumer only, on
// <prefix>-retry.<consumer>.<event name>, which every idem subscriber named
// consumer also reads. The failure-store commands use it to send a stored
// message back to the consumer that failed it: publishing it again on the
// event subject would reach every consuming service, and JetStream would
// drop it anyway if its id were still in the duplicate window. The copy has a
// Nats-Msg-Id of its own (the event id, ".retry." and a unique suffix), so it
// is never dropped as a duplicate; it keeps the "id" header, and the
// consumer deduplicates on the event id as always. It starts a full set of
// attempts again. consumer is the durable consumer's name
// (SubscriberConfig.Consumer), which the subscriber records as the source
// of the messages it parks.
func (p *Publisher) Redeliver(ctx context.Context, consumer string, msgs []idem.Message) error {
	outs := make([]*nats.Msg, len(msgs))
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		subject, err := p.cfg.Stream.RetrySubject(consumer, m.EventName)
		if err != nil {
			errs[i] = err
			continue
		}
		if m.Headers[idem.HeaderAttempt] != "" {
			h := make(map[string]string, len(m.Headers))
			for k, v := range m.Headers {
				if k != idem.HeaderAttempt {
					h[k] = v
				}
			}
			m.Headers = h
		}
		outs[i] = natsMsg(subject, m, m.EventID.String()+".retry."+nuid.Next())
	}
	return p.publish(ctx, outs, errs)
}

// PublishToConsumer implements broker.ConsumerPublisher: it publishes msgs
// on the retry subjects of consumer's durable consumer (Redeliver), which
// no other consumer reads, in the stream with its other messages: on a
// partitioned stream, the durable consumer of each message's partition
// (<consumer>-p<k>, k from its key as Publish computes it), so that it
// stays in order with the other messages of its aggregate. The durable
// consumer receives every message given, also those its bindings would not
// select.
func (p *Publisher) PublishToConsumer(ctx context.Context, consumer string, msgs []idem.Message) error {
	if p.cfg.Stream.Partitions == 0 {
		return p.Redeliver(ctx, consumer, msgs)
	}
	errs := make([]error, len(msgs))
	byDurable := map[string][]int{}
	var order []string
	for i, m := range msgs {
		d := SubscriberConfig{Consumer: consumer, Stream: p.cfg.Stream, Partition: p.cfg.Stream.Partition(m.Key)}.Durable()
		if _, ok := byDurable[d]; !ok {
			order = append(order, d)
		}
		byDurable[d] = append(byDurable[d], i)
	}
	for _, d := range order {
		idx := byDurable[d]
		part := make([]idem.Message, len(idx))
		for j, i := range idx {
			part[j] = msgs[i]
		}
		for j, err := range broker.Results(p.Redeliver(ctx, d, part), len(part)) {
			errs[idx[j]] = err
		}
	}
	for _, err := range errs {
		if err != nil {
			return &broker.BatchError{Errs: errs}
		}
	}
	return nil
}

// natsMsg returns the NATS message for m.
func natsMsg(subject string, m idem.Message, msgID string) *nats.Msg {
	h := make(nats.Header, len(m.Headers)+5)
	for k, v := range m.Headers {
		h[k] = []string{v}
	}
	if m.EventID != uuid.Nil {
		h[jetstream.MsgIDHeader] = []string{msgID}
		h[idem.HeaderEventID] = []string{m.EventID.String()}
	}
	h[idem.HeaderEventType] = []string{m.EventName}
	if len(m.Key) > 0 {
		h[HeaderKey] = []string{string(m.Key)}
	}
	if m.AggregateType != "" {
		h[HeaderAggregateType] = []string{m.AggregateType}
	}
	return &nats.Msg{Subject: subject, Header: h, Data: m.Body}
}

// publish sends outs (nil where errs already holds a failure) with at most
// MaxInFlight unacknowledged, and collects the acknowledgements.
func (p *Publisher) publish(ctx context.Context, outs []*nats.Msg, errs []error) error {
	if len(outs) == 0 {
		return nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	// pending holds the indexes of sent messages not yet acknowledged, oldest
	// first.
	pending := make([]int, 0, min(len(outs), p.cfg.MaxInFlight))
	futures := make([]jetstream.PubAckFuture, len(outs))
	waitOldest := func() error {
		i := pending[0]
		select {
		case <-futures[i].Ok():
		case err := <-futures[i].Err():
			errs[i] = ackError(err)
		case <-ctx.Done():
			return ctx.Err()
		}
		pending = pending[1:]
		return nil
	}
	for i, m := range outs {
		if m == nil {
			continue
		}
		for len(pending) >= p.cfg.MaxInFlight {
			if err := waitOldest(); err != nil {
				return err
			}
		}
		for {
			f, err := p.js.PublishMsgAsync(m)
			if err == nil {
				futures[i] = f
				pending = append(pending, i)
				break
			}
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				// Concurrent calls fill the client's window: wait for one
				// of ours, or for a moment, and try again.
				if len(pending) > 0 {
					if err := waitOldest(); err != nil {
						return err
					}
					continue
				}
				if !ctxsleep.Sleep(ctx, 10*time.Millisecond) {
					return ctx.Err()
				}
				continue
			}
			if errors.Is(err, nats.ErrConnectionClosed) {
				return fmt.Errorf("idem: nats: publish: %w", err)
			}
			errs[i] = fmt.Errorf("idem: nats: publish %s: %w", m.Subject, err)
			break
		}
	}
	for len(pending) > 0 {
		if err := waitOldest(); err != nil {
			return err
		}
	}
	for _, err := range errs {
		if err != nil {
			return &broker.BatchError{Errs: errs}
		}
	}
	return nil
}

// ackError translates a failed acknowledgement.
func ackError(err error) error {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("idem: nats: no stream captures the subject: %w (%v)", broker.ErrUnroutable, err)
	}
	return fmt.Errorf("idem: nats: publish not acknowledged: %w", err)
}
