package kafka

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// RoutedByValue is the placeholder of PublisherConfig.TopicReplacement
// replaced by the value of the routing field, as in Debezium's
// route.topic.replacement.
const RoutedByValue = "${routedByValue}"

// Routing fields (PublisherConfig.RouteByField), named after the outbox
// columns Debezium's route.by.field refers to.
const (
	// RouteByAggregateType routes by idem.Message.AggregateType (the
	// aggregatetype column). It is the default.
	RouteByAggregateType = "aggregatetype"
	// RouteByEventType routes by idem.Message.EventName (the type column).
	RouteByEventType = "type"
)

// ValueFormat is the format of record values a Publisher writes.
type ValueFormat int

// Value formats.
const (
	// Envelope writes the idem JSON envelope, as received from the outbox.
	// It is the default.
	Envelope ValueFormat = iota
	// DebeziumPayload writes the bare payload, as Debezium's Outbox Event
	// Router does, for consumers that expect Debezium's format. The event id
	// and name travel only in the headers "id" and "eventType".
	DebeziumPayload
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	ClientConfig
	// RouteByField is the message field whose value names the topic:
	// RouteByAggregateType ("aggregatetype", the default), RouteByEventType
	// ("type"), or the name of a message header. It plays the role of
	// Debezium's route.by.field.
	RouteByField string
	// TopicReplacement is the topic name, where RoutedByValue
	// ("${routedByValue}") is replaced by the routing field's value, as
	// Debezium's route.topic.replacement. Defaults to
	// "outbox.event.${routedByValue}".
	TopicReplacement string
	// ValueFormat is Envelope (the default) or DebeziumPayload.
	ValueFormat ValueFormat
	// CloudEvents, when set, publishes CloudEvents 1.0 instead of idem's
	// envelope, as idem.CloudEventsKafka says: in binary content mode, the
	// payload as the value and the attributes in the headers "ce_<name>"
	// with datacontenttype in "content-type"; in structured content mode,
	// the JSON event format as the value with "content-type:
	// application/cloudevents+json". The topic, the key (aggregate id) and
	// the headers "id" and "eventType" are as with the envelope, so a
	// consumer that reads Debezium's records reads a binary CloudEvent's
	// too. It excludes ValueFormat DebeziumPayload. Redeliver sends stored
	// records as they are.
	CloudEvents *idem.CloudEvents
	// GroupOf returns the consumer group of a consumer, for Inspect.
	// Defaults to the consumer's name.
	GroupOf func(consumer string) string
}

// WithDefaults returns c with zero fields set to their defaults.
func (c PublisherConfig) WithDefaults() PublisherConfig {
	c.ClientConfig = c.ClientConfig.withDefaults()
	if c.RouteByField == "" {
		c.RouteByField = RouteByAggregateType
	}
	if c.TopicReplacement == "" {
		c.TopicReplacement = TopicPrefixDefault + RoutedByValue
	}
	if c.GroupOf == nil {
		c.GroupOf = func(consumer string) string { return consumer }
	}
	return c
}

func (c PublisherConfig) validate() error {
	if err := c.ClientConfig.validate("PublisherConfig"); err != nil {
		return err
	}
	if c.ValueFormat != Envelope && c.ValueFormat != DebeziumPayload {
		return fmt.Errorf("idem: kafka: PublisherConfig.ValueFormat %d: want Envelope or DebeziumPayload", c.ValueFormat)
	}
	if c.CloudEvents != nil {
		if c.ValueFormat == DebeziumPayload {
			return errors.New("idem: kafka: PublisherConfig.CloudEvents with ValueFormat DebeziumPayload: choose one value format")
		}
		if err := c.CloudEvents.Validate(); err != nil {
			return fmt.Errorf("idem: kafka: PublisherConfig.CloudEvents: %w", err)
		}
	}
	if probe := strings.ReplaceAll(c.TopicReplacement, RoutedByValue, "x"); !validTopic(probe) {
		return fmt.Errorf("idem: kafka: PublisherConfig.TopicReplacement %q does not make a valid topic name (letters, digits, '.', '_', '-')", c.TopicReplacement)
	}
	return nil
}

// Publisher publishes idem messages to Kafka: topic from the routing field
// (outbox.event.<aggregate_type> by default), key = aggregate id, headers
// "id" (event id) and "eventType" (event name) besides the message's own
// headers, value = the envelope (or the bare payload, see ValueFormat). The
// producer is idempotent with acks=all, so records of one key reach their
// partition once each and in order. It implements broker.Publisher and is
// safe for concurrent use.
type Publisher struct {
	cfg PublisherConfig
	cl  *kgo.Client

	mu     sync.Mutex
	closed bool
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher returns a publisher. The client connects lazily; call Ping to
// check the brokers are reachable.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	opts := cfg.opts()
	// Publish waits for its records' acks: lingering would only add to
	// every call's latency. Records produced while a request is in flight
	// are still batched.
	opts = append(opts, kgo.ProducerLinger(0))
	opts = append(opts, cfg.Opts...)
	opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("idem: kafka: new publisher: %w", err)
	}
	return &Publisher{cfg: cfg, cl: cl}, nil
}

// Client returns the underlying franz-go client, for administration and
// metrics. Do not close it; close the Publisher.
func (p *Publisher) Client() *kgo.Client { return p.cl }

// Ping checks that a broker is reachable.
func (p *Publisher) Ping(ctx context.Context) error { return p.cl.Ping(ctx) }

// Close closes the client. Records not yet acknowledged fail.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.cl.Close()
	return nil
}

// Topic returns the topic m is routed to.
func (p *Publisher) Topic(m idem.Message) (string, error) {
	var v string
	switch p.cfg.RouteByField {
	case RouteByAggregateType, "aggregate_type":
		v = m.AggregateType
	case RouteByEventType, "event_name":
		v = m.EventName
	default:
		v = m.Headers[p.cfg.RouteByField]
	}
	if v == "" {
		return "", fmt.Errorf("idem: kafka: message %s has no %s to route it by", m.EventID, p.cfg.RouteByField)
	}
	topic := strings.ReplaceAll(p.cfg.TopicReplacement, RoutedByValue, v)
	if !validTopic(topic) {
		return "", fmt.Errorf("idem: kafka: message %s: %q is not a valid topic name", m.EventID, topic)
	}
	return topic, nil
}

// MessagingSystem implements broker.Describer: "kafka".
func (p *Publisher) MessagingSystem() string { return broker.SystemKafka }

// Destination implements broker.Describer: the topic m is routed to, "" when
// it cannot be routed.
func (p *Publisher) Destination(m idem.Message) string {
	topic, _ := p.Topic(m)
	return topic
}

// Publish implements broker.Publisher: it produces every message and returns
// once each is acknowledged by all in-sync replicas or has failed. Messages
// of one key are produced in the order given, to one partition.
func (p *Publisher) Publish(ctx context.Context, msgs []idem.Message) error {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		rec, err := p.record(m)
		if err != nil {
			errs[i] = err
			continue
		}
		wg.Add(1)
		p.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				errs[i] = produceError(fmt.Errorf("idem: kafka: produce %s to %s: %w", m.EventID, rec.Topic, err))
			}
			wg.Done()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return &broker.BatchError{Errs: errs}
		}
	}
	return nil
}

// produceError marks with idem.Transient the produce errors that say the
// cluster is unavailable for now (a retriable Kafka error, such as
// NOT_ENOUGH_REPLICAS or LEADER_NOT_AVAILABLE, that outlasted the client's
// retries, or a record timeout), so that a relay waits for the cluster
// instead of counting them against the message.
func produceError(err error) error {
	if kerr.IsRetriable(err) || errors.Is(err, kgo.ErrRecordTimeout) || errors.Is(err, kgo.ErrRecordRetries) ||
		errors.Is(err, kgo.ErrMaxBuffered) {
		return idem.Transient(err)
	}
	return err
}

// Redeliver produces msgs again, exactly as they were received (key,
// headers and value unchanged), to the topic of source: "<topic>/<partition>",
// the source a Subscriber gives its deliveries, which the consumer keeps with
// a parked message. "idem failed retry" re-drives parked records with it.
//
// Kafka has no per-consumer queue: every consumer group reading the topic
// receives the record again, and those that applied it already skip it as a
// duplicate. A record with a key goes to the partition of its key, which is
// the partition it came from as long as the topic's partition count is
// unchanged, so it stays in order with the rest of its aggregate. It returns
// once every record is acknowledged, with a *broker.BatchError for those that
// failed.
func (p *Publisher) Redeliver(ctx context.Context, source string, msgs []idem.Message) error {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return ErrClosed
	}
	topic := source
	if i := strings.LastIndexByte(source, '/'); i >= 0 {
		topic = source[:i]
	}
	if !validTopic(topic) {
		return fmt.Errorf("idem: kafka: redeliver: source %q does not name a topic (want <topic>/<partition>)", source)
	}
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		headers := make([]kgo.RecordHeader, 0, len(m.Headers))
		for k, v := range m.Headers {
			headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		rec := &kgo.Record{Topic: topic, Key: m.Key, Value: m.Body, Headers: headers}
		wg.Add(1)
		p.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				errs[i] = produceError(fmt.Errorf("idem: kafka: redeliver %s to %s: %w", m.EventID, topic, err))
			}
			wg.Done()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return &broker.BatchError{Errs: errs}
		}
	}
	return nil
}

// record returns the Kafka record for m.
func (p *Publisher) record(m idem.Message) (*kgo.Record, error) {
	topic, err := p.Topic(m)
	if err != nil {
		return nil, err
	}
	if p.cfg.CloudEvents != nil {
		ce, err := p.cfg.CloudEvents.Encode(m, idem.CloudEventsKafka)
		if err != nil {
			return nil, fmt.Errorf("idem: kafka: message %s: %w", m.EventID, err)
		}
		m = ce
	}
	value := m.Body
	if p.cfg.ValueFormat == DebeziumPayload {
		value = bareValue(m.Body)
	}
	headers := make([]kgo.RecordHeader, 0, len(m.Headers)+2)
	if m.EventID != uuid.Nil {
		headers = append(headers, kgo.RecordHeader{Key: idem.HeaderEventID, Value: []byte(m.EventID.String())})
	}
	if m.EventName != "" {
		headers = append(headers, kgo.RecordHeader{Key: idem.HeaderEventType, Value: []byte(m.EventName)})
	}
	for k, v := range m.Headers {
		if (k == idem.HeaderEventID && m.EventID != uuid.Nil) || (k == idem.HeaderEventType && m.EventName != "") {
			continue
		}
		headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	return &kgo.Record{Topic: topic, Key: m.Key, Value: value, Headers: headers}, nil
}

// bareValue returns the payload of an envelope body, or body itself when it
// is not an envelope (a message that came from Debezium and is republished).
func bareValue(body []byte) []byte {
	b := bytes.TrimSpace(body)
	if len(b) == 0 || b[0] != '{' {
		return body
	}
	var env struct {
		EventID *string         `json:"event_id"`
		Payload json.RawMessage `json:"payload"`
	}
	if json.Unmarshal(b, &env) != nil || env.EventID == nil || env.Payload == nil {
		return body
	}
	return env.Payload
}
