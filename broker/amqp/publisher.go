package amqp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/backoff"
)

// ChannelsDefault is how many Publish calls a Publisher runs at once.
const ChannelsDefault = 4

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	ConnConfig
	// Exchange is the topic exchange messages are published to, with the
	// event name as routing key. Defaults to "events".
	Exchange string
	// NoDeclare skips declaring Exchange on connect, for brokers where the
	// application may not declare (the exchange must then exist).
	NoDeclare bool
	// Channels is how many Publish calls run at once, each on its own AMQP
	// channel with publisher confirms; further calls wait. Defaults to 4.
	Channels int
	// QueueOf returns the queue a consumer reads, for Inspect and
	// PublishToConsumer. Defaults to QueueName ("<consumer>.events", the
	// queues of "idem" and the shop).
	QueueOf func(consumer string) string
	// CloudEvents, when set, publishes CloudEvents 1.0 instead of idem's
	// envelope, in binary content mode (the payload as the body,
	// attributes in the headers "cloudEvents_<name>", datacontenttype in
	// the content-type property) or in structured content mode (content
	// type application/cloudevents+json), as idem.CloudEventsAMQP says.
	// message_id, type, the routing key and idem's own headers are as
	// with the envelope. Redeliver sends stored messages as they are.
	CloudEvents *idem.CloudEvents
}

// QueueName returns "<consumer>.events", the queue of a consumer when
// nothing else is configured (PublisherConfig.QueueOf).
func QueueName(consumer string) string { return consumer + ".events" }

// WithDefaults returns c with zero fields set to their defaults.
func (c PublisherConfig) WithDefaults() PublisherConfig {
	c.ConnConfig = c.ConnConfig.withDefaults()
	if c.Exchange == "" {
		c.Exchange = ExchangeDefault
	}
	if c.Channels == 0 {
		c.Channels = ChannelsDefault
	}
	if c.QueueOf == nil {
		c.QueueOf = QueueName
	}
	return c
}

func (c PublisherConfig) validate() error {
	if err := c.ConnConfig.validate("PublisherConfig"); err != nil {
		return err
	}
	if c.Channels < 1 {
		return fmt.Errorf("idem: amqp: PublisherConfig.Channels %d: want at least 1", c.Channels)
	}
	if c.CloudEvents != nil {
		if err := c.CloudEvents.Validate(); err != nil {
			return fmt.Errorf("idem: amqp: PublisherConfig.CloudEvents: %w", err)
		}
	}
	return nil
}

// Publisher publishes idem messages to a RabbitMQ topic exchange: persistent
// messages, message_id = event id, type = event name, routing key = event
// name, with publisher confirms and the mandatory flag, so that a message no
// queue is bound for is reported (broker.ErrUnroutable) instead of silently
// dropped. It implements broker.Publisher.
//
// A Publisher connects on first use and reconnects, with backoff, after the
// connection is lost: a Publish call that meets a closed connection returns
// an error (nothing in it may be taken as accepted), and a later call
// reconnects. It is safe for concurrent use.
type Publisher struct {
	cfg PublisherConfig
	sem chan struct{}

	mu       sync.Mutex
	conn     *amqp091.Connection
	gen      uint64
	idle     []*pubChannel
	closed   bool
	bo       backoff.Backoff
	nextDial time.Time
	lastErr  error
}

var (
	_ broker.Publisher = (*Publisher)(nil)
	_ broker.Inspector = (*Publisher)(nil)
)

// pubChannel is a channel in confirm mode with its return listener.
type pubChannel struct {
	ch      *amqp091.Channel
	gen     uint64
	returns chan amqp091.Return
	closed  chan *amqp091.Error
}

// NewPublisher returns a publisher; it connects on first use (or Connect).
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Publisher{
		cfg: cfg,
		sem: make(chan struct{}, cfg.Channels),
		bo:  backoff.Backoff{Base: cfg.ReconnectMin, Max: cfg.ReconnectMax},
	}, nil
}

// ErrClosed is returned by a Publisher or Subscriber used after Close/Stop.
var ErrClosed = errors.New("idem: amqp: closed")

// Connect connects now (and declares the exchange) rather than on the first
// Publish, to report a wrong URL or credentials early.
func (p *Publisher) Connect(ctx context.Context) error {
	pc, err := p.channel(ctx)
	if err != nil {
		return err
	}
	p.release(pc)
	return nil
}

// Close closes the connection. Publish calls in progress fail.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.idle = nil
	if p.conn != nil {
		err := p.conn.Close()
		p.conn = nil
		if err != nil && !errors.Is(err, amqp091.ErrClosed) {
			return err
		}
	}
	return nil
}

// Publish implements broker.Publisher: it publishes msgs to the exchange with
// their event names as routing keys and waits for every confirm. A message
// no queue is bound for fails with an error wrapping broker.ErrUnroutable.
func (p *Publisher) Publish(ctx context.Context, msgs []idem.Message) error {
	targets := make([]target, len(msgs))
	for i, m := range msgs {
		targets[i] = target{exchange: p.cfg.Exchange, key: m.EventName, msg: m}
		if p.cfg.CloudEvents != nil {
			ce, err := p.cfg.CloudEvents.Encode(m, idem.CloudEventsAMQP)
			if err != nil {
				targets[i].err = fmt.Errorf("idem: amqp: message %s: %w", m.EventID, err)
				continue
			}
			targets[i].msg = ce
		}
	}
	return p.publish(ctx, targets)
}

// MessagingSystem implements broker.Describer: "rabbitmq".
func (p *Publisher) MessagingSystem() string { return broker.SystemRabbitMQ }

// Destination implements broker.Describer: the exchange every message is
// published to (its routing key is the event name).
func (p *Publisher) Destination(idem.Message) string { return p.cfg.Exchange }

// Redeliver publishes msgs, through the default exchange, to queue only
// (not to the topic exchange, where every service bound to the event would
// receive them again). The failure-store commands use it to send a stored
// message back to the consumer that failed it. The attempt header is
// dropped, so the message gets a full set of attempts again.
func (p *Publisher) Redeliver(ctx context.Context, queue string, msgs []idem.Message) error {
	if queue == "" {
		return errors.New("idem: amqp: Redeliver: no queue given")
	}
	targets := make([]target, len(msgs))
	for i, m := range msgs {
		targets[i] = target{exchange: "", key: queue, msg: withoutAttempt(m)}
	}
	return p.publish(ctx, targets)
}

// target is one message with where it goes. pub, when set, is published as
// is instead of a publishing made from msg.
type target struct {
	exchange, key string
	msg           idem.Message
	pub           *amqp091.Publishing
	err           error // the message could not be made: not sent
}

// bucketNames holds the bucket header value of each bucket, its number in
// decimal.
var bucketNames = func() (names [Buckets]string) {
	for b := range names {
		names[b] = strconv.Itoa(b)
	}
	return names
}()

// publishing returns the AMQP message for m, with the headers of m, the key
// header and the bucket header. The header idem.HeaderContentType, when m
// has it, is the content-type property (application/json otherwise).
func publishing(m idem.Message) amqp091.Publishing {
	headers := make(amqp091.Table, len(m.Headers)+2)
	contentType := idem.ContentTypeJSON
	for k, v := range m.Headers {
		if k == idem.HeaderContentType {
			contentType = v
			continue
		}
		headers[k] = v
	}
	if len(m.Key) > 0 {
		headers[HeaderKey] = string(m.Key)
	}
	// Every message, with a key or not, gets its bucket, so that partitioned
	// consumers route it by bucket (a message without the header goes to
	// their partition 0).
	headers[HeaderBucket] = bucketNames[Bucket(m.Key)]
	pub := amqp091.Publishing{
		Headers:      headers,
		ContentType:  contentType,
		DeliveryMode: amqp091.Persistent,
		Type:         m.EventName,
		Body:         m.Body,
	}
	if m.EventID != uuid.Nil {
		pub.MessageId = m.EventID.String()
	}
	return pub
}

// publish sends targets on one confirm channel and waits for their confirms
// and returns.
func (p *Publisher) publish(ctx context.Context, targets []target) error {
	if len(targets) == 0 {
		return nil
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.sem }()

	errs := make([]error, len(targets))
	failed, nacked := false, false
	for i, t := range targets {
		if t.err != nil {
			errs[i] = t.err
			failed = true
			continue
		}
		if t.key == "" {
			errs[i] = fmt.Errorf("idem: amqp: message %s has no event name (routing key)", t.msg.EventID)
			failed = true
		}
	}

	pc, err := p.channel(ctx)
	if err != nil {
		return err
	}
	healthy := false
	defer func() {
		if healthy {
			p.release(pc)
		} else {
			_ = pc.ch.Close()
		}
	}()
	// Returns left over from an abandoned call belong to no one.
	for len(pc.returns) > 0 {
		<-pc.returns
	}

	dcs := make([]*amqp091.DeferredConfirmation, len(targets))
	byID := make(map[string][]int, len(targets))
	for i, t := range targets {
		if errs[i] != nil {
			continue
		}
		var pub amqp091.Publishing
		if t.pub != nil {
			pub = *t.pub
		} else {
			pub = publishing(t.msg)
		}
		dc, err := pc.ch.PublishWithDeferredConfirmWithContext(ctx, t.exchange, t.key, true, false, pub)
		if err != nil {
			return p.channelErr(ctx, pc, "publish", err)
		}
		dcs[i] = dc
		byID[pub.MessageId] = append(byID[pub.MessageId], i)
	}

	returned := make(map[int]amqp091.Return)
	onReturn := func(r amqp091.Return) {
		idx := byID[r.MessageId]
		for _, i := range idx {
			if _, done := returned[i]; !done {
				returned[i] = r
				return
			}
		}
	}
	for i, dc := range dcs {
		if dc == nil {
			continue
		}
	wait:
		for {
			select {
			case <-dc.Done():
				break wait
			case r := <-pc.returns:
				onReturn(r)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if !dc.Acked() {
			if pc.ch.IsClosed() {
				return p.channelErr(ctx, pc, "wait for confirms", nil)
			}
			errs[i] = fmt.Errorf("idem: amqp: broker refused (nacked) message %s", targets[i].msg.EventID)
			failed, nacked = true, true
		}
	}
	// A return comes before the confirm of its message.
	for len(pc.returns) > 0 {
		onReturn(<-pc.returns)
	}
	for i, r := range returned {
		if errs[i] == nil {
			errs[i] = fmt.Errorf("%w: exchange %q, routing key %q: %d %s", broker.ErrUnroutable, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
			failed = true
		}
	}
	// A channel whose messages were nacked is not used again: a quorum
	// queue's client state on the broker's side of a channel can keep
	// nacking every message after its leader's node died (RabbitMQ 3.10);
	// a new channel gets a fresh one.
	healthy = !nacked
	if failed {
		return &broker.BatchError{Errs: errs}
	}
	return nil
}

// channelErr explains why pc failed: the context, a channel-level error or a
// lost connection.
func (p *Publisher) channelErr(ctx context.Context, pc *pubChannel, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	p.mu.Lock()
	conn := p.conn
	p.mu.Unlock()
	var reason error
	if conn == nil || conn.IsClosed() {
		reason = errors.New("connection lost")
	} else if pc.ch.IsClosed() {
		reason = errors.New("channel closed")
		select {
		case e := <-pc.closed:
			if e != nil {
				reason = describeClose("channel", e)
			}
		default:
		}
	}
	switch {
	case err != nil && reason != nil:
		return fmt.Errorf("idem: amqp: %s to %s: %w (%v)", op, p.cfg.redacted(), reason, err)
	case err != nil:
		return fmt.Errorf("idem: amqp: %s to %s: %w", op, p.cfg.redacted(), err)
	case reason != nil:
		return fmt.Errorf("idem: amqp: %s to %s: %w, before every confirm arrived", op, p.cfg.redacted(), reason)
	}
	return fmt.Errorf("idem: amqp: %s to %s failed", op, p.cfg.redacted())
}

// channel returns an idle confirm channel or opens one, connecting first if
// needed.
func (p *Publisher) channel(ctx context.Context) (*pubChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	for len(p.idle) > 0 {
		pc := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if pc.gen == p.gen && !pc.ch.IsClosed() {
			return pc, nil
		}
	}
	if p.conn == nil || p.conn.IsClosed() {
		if err := p.connectLocked(ctx); err != nil {
			return nil, err
		}
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("idem: amqp: open channel on %s: %w", p.cfg.redacted(), err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("idem: amqp: enable publisher confirms: %w", err)
	}
	pc := &pubChannel{ch: ch, gen: p.gen, returns: make(chan amqp091.Return, 256), closed: make(chan *amqp091.Error, 1)}
	ch.NotifyReturn(pc.returns)
	ch.NotifyClose(pc.closed)
	return pc, nil
}

// connectLocked (re)connects, at most once per backoff delay; p.mu is held.
func (p *Publisher) connectLocked(ctx context.Context) error {
	if wait := time.Until(p.nextDial); wait > 0 && p.lastErr != nil {
		return fmt.Errorf("idem: amqp: not connected to %s (next attempt in %v): %w", p.cfg.redacted(), wait.Round(time.Millisecond), p.lastErr)
	}
	if p.conn != nil {
		_ = p.conn.Close()
		p.conn = nil
		p.cfg.Logger.Warn("amqp publisher: connection lost; reconnecting", "url", p.cfg.redacted())
	}
	conn, err := p.cfg.dial(ctx)
	if err == nil && !p.cfg.NoDeclare {
		err = declareOnce(conn, func(ch *amqp091.Channel) error { return declareExchange(ch, p.cfg.Exchange) })
		if err != nil {
			_ = conn.Close()
		}
	}
	if err != nil {
		p.lastErr = err
		p.nextDial = time.Now().Add(p.bo.Next())
		return err
	}
	if p.lastErr != nil {
		p.cfg.Logger.Info("amqp publisher: connected", "url", p.cfg.redacted())
	}
	p.bo.Reset()
	p.lastErr = nil
	p.conn = conn
	p.gen++
	p.idle = nil
	return nil
}

// release returns a healthy channel to the idle list.
func (p *Publisher) release(pc *pubChannel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || pc.gen != p.gen || pc.ch.IsClosed() {
		_ = pc.ch.Close()
		return
	}
	p.idle = append(p.idle, pc)
}

// declareOnce runs declare on a short-lived channel of conn.
func declareOnce(conn *amqp091.Connection, declare func(*amqp091.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("idem: amqp: open channel: %w", err)
	}
	if err := declare(ch); err != nil {
		return err // a failed declaration closes the channel
	}
	return ch.Close()
}
