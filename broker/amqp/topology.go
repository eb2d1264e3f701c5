package amqp

import (
	"fmt"
	"math"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// QueueType is the kind of queue a subscriber declares.
type QueueType string

// Queue types.
const (
	// Classic is a classic queue, declared as version 2 (x-queue-version: 2),
	// which stores messages more efficiently than version 1.
	Classic QueueType = "classic"
	// Quorum is a replicated quorum queue (x-queue-type: quorum).
	Quorum QueueType = "quorum"
)

// declareExchange declares the durable topic exchange events are published
// to. Declaring an existing exchange with the same properties is a no-op.
func declareExchange(ch *amqp091.Channel, name string) error {
	if name == "" {
		return nil // the default exchange always exists
	}
	if err := ch.ExchangeDeclare(name, amqp091.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("idem: amqp: declare exchange %q: %w", name, err)
	}
	return nil
}

// queueArgs returns the declaration arguments of a consumer queue.
func queueArgs(t QueueType) amqp091.Table {
	if t == Quorum {
		return amqp091.Table{"x-queue-type": "quorum"}
	}
	return amqp091.Table{"x-queue-version": int32(2)}
}

// declareQueue declares the consumer's durable queue and binds it to exchange
// with each pattern.
func declareQueue(ch *amqp091.Channel, exchange, queue string, t QueueType, bindings []string) error {
	if _, err := ch.QueueDeclare(queue, true, false, false, false, queueArgs(t)); err != nil {
		return fmt.Errorf("idem: amqp: declare queue %q: %w", queue, err)
	}
	for _, b := range bindings {
		if err := ch.QueueBind(queue, b, exchange, false, nil); err != nil {
			return fmt.Errorf("idem: amqp: bind queue %q to exchange %q with %q: %w", queue, exchange, b, err)
		}
	}
	return nil
}

// Retries go through delay queues that need no plugin: a retry copy is
// published, through the default exchange, to "<queue>.retry.<delay>", a
// queue without consumers whose messages expire after <delay> and are then
// dead-lettered, through the default exchange again, to <queue> only. Other
// services bound to the same event never see the retry.
//
// Delays are rounded up to a small set of buckets (the R10 preferred numbers:
// 1, 1.25, 1.6, 2, 2.5, 3.15, 4, 5, 6.3, 8 times a power of ten, in
// milliseconds), so that a few queues serve every delay; each copy also
// carries its exact delay as its expiration, so the jitter of the retry
// policy survives within a bucket.
var r10 = [...]float64{1, 1.25, 1.6, 2, 2.5, 3.15, 4, 5, 6.3, 8}

// delayBucket returns the smallest bucket that is at least d, at least 1ms.
func delayBucket(d time.Duration) time.Duration {
	ms := float64(d) / float64(time.Millisecond)
	if ms <= 1 {
		return time.Millisecond
	}
	exp := math.Pow(10, math.Floor(math.Log10(ms)))
	for _, r := range r10 {
		if v := math.Round(r * exp); v >= math.Ceil(ms) {
			return time.Duration(v) * time.Millisecond
		}
	}
	return time.Duration(math.Round(10*exp)) * time.Millisecond
}

// delayQueueName returns the name of queue's delay queue for bucket.
func delayQueueName(queue string, bucket time.Duration) string {
	return fmt.Sprintf("%s.retry.%dms", queue, bucket.Milliseconds())
}

// declareDelayQueue declares queue's delay queue for bucket.
func declareDelayQueue(ch *amqp091.Channel, queue string, bucket time.Duration) (string, error) {
	name := delayQueueName(queue, bucket)
	args := amqp091.Table{
		"x-queue-version":           int32(2),
		"x-message-ttl":             bucket.Milliseconds(),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": queue,
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		return "", fmt.Errorf("idem: amqp: declare delay queue %q: %w", name, err)
	}
	return name, nil
}
