package broker

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

// Subscriber consumes messages from a broker and hands them to a
// DeliverFunc: the subscribers of broker/amqp, broker/kafka and broker/nats.
type Subscriber interface {
	// Start connects and starts consuming. Its context bounds the start-up
	// only (connecting, declaring): once Start has returned, the subscriber
	// runs until Stop.
	Start(ctx context.Context) error
	// Stop stops consuming, lets the work in progress finish and
	// acknowledges it, and returns when everything has ended. When ctx ends
	// first, the work in progress is abandoned (its messages come back
	// later) and Stop returns ctx's error at once: the work ends in the
	// background (idem's subscribers close their Done channel once it has).
	// Stop is idempotent and safe to call from several goroutines, also
	// before or during Start.
	Stop(ctx context.Context) error
}

// DeliverFunc hands deliveries to an idempotent consumer and says what to do
// with each: inbox.Consumer.DeliverBatch, for any transaction type. The i-th
// disposition and error are for ds[i]; a non-nil error means the message was
// neither handled nor parked, and must not be acknowledged.
type DeliverFunc func(ctx context.Context, ds []Delivery) ([]Disposition, []error)

// Delivery is a message as a transport received it.
type Delivery struct {
	// Message is the message exactly as received.
	Message idem.Message
	// Source names where it came from: queue, topic/partition or durable
	// consumer. "idem failed retry" sends a parked message back to it
	// (Redeliverer).
	Source string
	// Attempt numbers the deliveries of the message to the consumer, from 1,
	// as far as the transport knows (a header it carries, the broker's
	// delivery count, its own retries), for information: the consumer
	// counts failed attempts in its database.
	Attempt int
	// System names the transport the message came from, as OpenTelemetry's
	// messaging.system attribute spells it (SystemRabbitMQ, SystemKafka,
	// SystemNATS); empty when unknown. The consumer's trace spans carry it.
	System string
}

// Messaging systems, as OpenTelemetry's messaging.system attribute spells
// them: the values of Delivery.System and Describer.MessagingSystem.
const (
	SystemRabbitMQ = "rabbitmq"
	SystemKafka    = "kafka"
	SystemNATS     = "nats"
)

// Describer is implemented by publishers that say, for trace spans, which
// messaging system they publish to and where each message goes: the relay's
// spans carry them as OpenTelemetry's messaging.system and
// messaging.destination.name. broker/amqp (the exchange), broker/kafka (the
// topic) and broker/nats (the subject) implement it.
type Describer interface {
	// MessagingSystem returns the messaging system (SystemRabbitMQ...).
	MessagingSystem() string
	// Destination returns where msg is published, or "" when it cannot be
	// routed.
	Destination(msg idem.Message) string
}

// Action tells a transport what to do with a delivery.
type Action int

// Actions.
const (
	// Ack: the message is done (applied, duplicate, ignored, or parked in the
	// failure store). Acknowledge it or commit past it.
	Ack Action = iota + 1
	// Retry: keep the message unacknowledged and deliver it again after
	// Disposition.RetryAfter. Until then, later messages of its aggregate
	// wait behind it (deliver them with it, after it, in order); other
	// messages go on.
	Retry
	// Pause: the consumer cannot work for now (its database or a dependency
	// is away: a transient failure). Keep the message unacknowledged, take no
	// new message until Disposition.RetryAfter has passed, then deliver it
	// again. A pause costs no attempt.
	Pause
)

// String returns the action in lower case ("ack", "retry", "pause").
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Pause:
		return "pause"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Outcome says what a consumer did with an event.
type Outcome int

// Outcomes.
const (
	// Applied: the handlers ran and their effects committed with the marker.
	Applied Outcome = iota + 1
	// Duplicate: the event was already applied by this consumer; no handler
	// ran.
	Duplicate
	// Ignored: no handler is registered for the event name; nothing was
	// written.
	Ignored
	// Failed: a handler or the database failed; nothing was committed.
	Failed
	// Parked: the message was stored in the failure store.
	Parked
	// Deferred: the event was not attempted because an earlier event of its
	// aggregate in the same delivery failed and waits for a retry. It is
	// delivered again after that one.
	Deferred
	// Paused: the event was not attempted, or failed transiently, because a
	// dependency of the consumer is away. It is delivered again when the
	// consumer resumes.
	Paused
)

// String returns the outcome in lower case ("applied", "duplicate", ...).
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Ignored:
		return "ignored"
	case Failed:
		return "failed"
	case Parked:
		return "parked"
	case Deferred:
		return "deferred"
	case Paused:
		return "paused"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Disposition is the consumer's verdict on a delivery.
type Disposition struct {
	Action  Action
	Outcome Outcome
	// RetryAfter is how long to wait before delivering the message again
	// (Retry and Pause).
	RetryAfter time.Duration
	// Attempts is the number of failed attempts of the event counted so far
	// by the consumer (in its database, so it survives restarts and
	// rebalances); 0 when none failed or the count is unknown.
	Attempts int
	// Err is the decoding or handling error, if any.
	Err error
	// Event is the decoded event (zero if undecodable).
	Event idem.Event
}

// Redeliverer is implemented by publishers that can send a message back to
// the one consumer it was received from (Delivery.Source), rather than to
// every subscriber of its event: what "idem failed retry" needs to re-drive
// a parked message. broker/amqp (to the queue), broker/nats (to the durable
// consumer's retry subject) and broker/kafka (to the topic; every group
// reading it receives the record again, and those that applied it skip it)
// implement it.
type Redeliverer interface {
	// Redeliver publishes msgs, as they are, to source only, and returns
	// when each is confirmed (a *BatchError for those refused).
	Redeliver(ctx context.Context, source string, msgs []idem.Message) error
}

// ConsumerPublisher is implemented by publishers that can send messages to
// one consumer only, by its name, where no other consumer bound to their
// events sees them: what "idem failed retry --to-consumer"
// (inbox.FailureStore.Redirect) and "idem replay --to-consumer"
// (ToConsumer) need. broker/amqp publishes to the
// consumer's queue through the default exchange (through its partition
// exchange when the consumer is partitioned), broker/nats to the
// consumer's retry subject, which only its durable consumer reads, in the
// stream with its other messages, and broker/memory to its queue.
// broker/kafka does not: every consumer group reads the same topics (a
// group replays by moving back its offsets: Rewinder).
type ConsumerPublisher interface {
	// PublishToConsumer publishes msgs to consumer only, and returns when
	// each is confirmed (a *BatchError for those refused). Messages with
	// the same key reach the consumer in the order given, when each call
	// waits for the previous one. The attempt header (idem.HeaderAttempt)
	// is dropped: the consumer gets a full set of attempts.
	PublishToConsumer(ctx context.Context, consumer string, msgs []idem.Message) error
}

// Rewinder is implemented by publishers of transports whose consumers read
// one shared log and replay by moving back their own position, which no
// ConsumerPublisher can reach one at a time: broker/kafka, whose consumer
// groups keep their offsets. "idem replay --to-consumer" rewinds with it.
type Rewinder interface {
	// Rewind moves consumer's position back, on each partition where it
	// has one, to the first record the broker took at or after to, and
	// returns on how many partitions it moved. It never moves a position
	// forward. The consumer must be stopped (its group without members):
	// a running consumer's position is its own, and Rewind says so.
	Rewind(ctx context.Context, consumer string, to time.Time) (int, error)
}

// ToConsumer returns a Publisher whose Publish sends messages to consumer
// only, through cp's PublishToConsumer: what "idem replay --to-consumer"
// gives relay.Replay, so that a replay reaches one consumer's queue and
// no other.
func ToConsumer(cp ConsumerPublisher, consumer string) Publisher {
	return toConsumer{cp: cp, consumer: consumer}
}

// toConsumer is the Publisher of ToConsumer.
type toConsumer struct {
	cp       ConsumerPublisher
	consumer string
}

// Publish implements Publisher.
func (p toConsumer) Publish(ctx context.Context, msgs []idem.Message) error {
	return p.cp.PublishToConsumer(ctx, p.consumer, msgs)
}

// Inspector is implemented by transports that can tell what waits in the
// broker for a consumer ("idem status", the dashboard). Each transport's
// Publisher implements it: RabbitMQ (the consumer's queue, by a passive
// declare), Kafka (the consumer group's lag), NATS JetStream (the durable
// consumer's pending and unacknowledged messages).
type Inspector interface {
	// Inspect returns the figures of each consumer's queue, durable
	// consumer or group. A consumer the broker does not know is left out.
	Inspect(ctx context.Context, consumers []string) ([]QueueStats, error)
}

// QueueStats is what waits in the broker for one consumer. A figure the
// transport cannot tell is -1.
type QueueStats struct {
	// Consumer is the consumer's name.
	Consumer string
	// Queue names the queue, durable consumer or consumer group.
	Queue string
	// Ready counts messages waiting to be delivered.
	Ready int64
	// Unacked counts messages delivered and not yet acknowledged.
	Unacked int64
	// Lag counts records between the group's committed offsets and the
	// ends of its partitions (Kafka).
	Lag int64
	// Consumers counts the clients consuming from the queue, durable
	// consumer or group (RabbitMQ: its consumers; Kafka: the group's
	// members; NATS: the pull requests waiting).
	Consumers int64
}

// Waiting is what waits for the consumer, delivered or not: Lag when the
// transport tells it, else Ready plus Unacked (each when known); -1 when
// the transport tells none of them.
func (q QueueStats) Waiting() int64 {
	if q.Lag >= 0 {
		return q.Lag
	}
	if q.Ready < 0 && q.Unacked < 0 {
		return -1
	}
	return max(q.Ready, 0) + max(q.Unacked, 0)
}
