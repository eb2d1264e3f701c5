package amqp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/broker/internal/keyhash"
)

// QueueType is the kind of queue a subscriber declares.
type QueueType string

// Queue types.
const (
	// Classic is a classic queue, declared as version 2 (x-queue-version: 2),
	// which stores messages more efficiently than version 1.
	Classic QueueType = "classic"
	// Quorum is a replicated quorum queue (x-queue-type: quorum), declared
	// with x-single-active-consumer: RabbitMQ ignores the exclusive flag of
	// a quorum queue's consumers, so the queue itself must deliver to one
	// consumer at a time.
	Quorum QueueType = "quorum"
)

// Buckets is the number of buckets the publisher spreads aggregates over: the
// header HeaderBucket of every message is Bucket(key), and a partitioned
// consumer with P partitions binds bucket b to its partition queue b mod P.
// It bounds SubscriberConfig.Partitions, and must never change: it fixes
// which partition each aggregate belongs to.
const Buckets = 64

// HeaderBucket is the header carrying Bucket of the message key (the
// aggregate id), set by the Publisher on every message. The partitioned
// consumers' headers exchanges route on it.
const HeaderBucket = "idem-bucket"

// Bucket returns the bucket of an aggregate key, 0 to Buckets-1: FNV-1a 32 of
// key modulo Buckets, the same hash broker/nats uses for its partitions.
func Bucket(key []byte) int { return keyhash.Mod(key, Buckets) }

// PartitionExchange names the headers exchange that routes the messages of
// queue, for a consumer split into n partitions, to its partition queues:
// "<queue>.part<n>". Its name carries n so that a consumer whose partition
// count changed gets a new exchange with the new bindings, and the
// subscribers delete the exchanges of the other counts (see the package
// documentation).
func PartitionExchange(queue string, n int) string { return queue + ".part" + strconv.Itoa(n) }

// NoBucketExchange names the fanout exchange that receives the messages of a
// partitioned consumer that carry no bucket header (published by something
// other than idem's Publisher): "<queue>.nobucket". It is the alternate
// exchange of the partition exchange and is bound to partition 0's queue, so
// these messages all land there, in their order.
func NoBucketExchange(queue string) string { return queue + ".nobucket" }

// legacyHashExchange names the x-consistent-hash exchange of earlier idem
// versions, which the subscribers delete.
func legacyHashExchange(queue string) string { return queue + ".hash" }

// PartitionQueue names partition k of queue: "<queue>.p<k>".
func PartitionQueue(queue string, k int) string { return queue + ".p" + strconv.Itoa(k) }

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
		return amqp091.Table{"x-queue-type": "quorum", "x-single-active-consumer": true}
	}
	return amqp091.Table{"x-queue-version": int32(2)}
}

// declareQueue declares the consumer's durable queue and binds it to exchange
// with each pattern.
func declareQueue(ch *amqp091.Channel, exchange, queue string, t QueueType, bindings []string) error {
	if _, err := ch.QueueDeclare(queue, true, false, false, false, queueArgs(t)); err != nil {
		return queueDeclareErr(queue, t, err)
	}
	for _, b := range bindings {
		if err := ch.QueueBind(queue, b, exchange, false, nil); err != nil {
			return fmt.Errorf("idem: amqp: bind queue %q to exchange %q with %q: %w", queue, exchange, b, err)
		}
	}
	return nil
}

// declarePartitions declares the topology of a consumer split into n
// partitions: the partition queues "<queue>.p0" to "<queue>.p<n-1>"; the
// headers exchange PartitionExchange(queue, n), bound to exchange with each
// pattern, which routes a message whose bucket header is b to queue
// "<queue>.p<b mod n>" (one binding per bucket: x-match all, idem-bucket b);
// and its alternate exchange NoBucketExchange(queue), a fanout exchange
// bound to "<queue>.p0", for messages without the bucket header. It then
// deletes the partition exchanges of the other partition counts and the
// consistent-hash exchange of earlier versions, which would otherwise route
// copies of the same messages by another mapping. Every declaration is
// idempotent, and deleting a missing exchange is a no-op.
func declarePartitions(ch *amqp091.Channel, exchange, queue string, t QueueType, bindings []string, n int) error {
	for k := range n {
		pq := PartitionQueue(queue, k)
		if _, err := ch.QueueDeclare(pq, true, false, false, false, queueArgs(t)); err != nil {
			return queueDeclareErr(pq, t, err)
		}
	}
	nb := NoBucketExchange(queue)
	if err := ch.ExchangeDeclare(nb, amqp091.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("idem: amqp: declare exchange %q: %w", nb, err)
	}
	if err := ch.QueueBind(PartitionQueue(queue, 0), "", nb, false, nil); err != nil {
		return fmt.Errorf("idem: amqp: bind queue %q to exchange %q: %w", PartitionQueue(queue, 0), nb, err)
	}
	px := PartitionExchange(queue, n)
	if err := ch.ExchangeDeclare(px, amqp091.ExchangeHeaders, true, false, false, false, amqp091.Table{"alternate-exchange": nb}); err != nil {
		return fmt.Errorf("idem: amqp: declare exchange %q: %w", px, err)
	}
	for b := range Buckets {
		pq := PartitionQueue(queue, b%n)
		args := amqp091.Table{"x-match": "all", HeaderBucket: strconv.Itoa(b)}
		if err := ch.QueueBind(pq, "", px, false, args); err != nil {
			return fmt.Errorf("idem: amqp: bind queue %q to exchange %q for bucket %d: %w", pq, px, b, err)
		}
	}
	// Bound from the events exchange last: nothing reaches px before its
	// bindings are complete.
	for _, b := range bindings {
		if err := ch.ExchangeBind(px, b, exchange, false, nil); err != nil {
			return fmt.Errorf("idem: amqp: bind exchange %q to exchange %q with %q: %w", px, exchange, b, err)
		}
	}
	stale := []string{legacyHashExchange(queue)}
	for m := 1; m <= Buckets; m++ {
		if m != n {
			stale = append(stale, PartitionExchange(queue, m))
		}
	}
	for _, x := range stale {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			return fmt.Errorf("idem: amqp: delete exchange %q of another partition count: %w", x, err)
		}
	}
	return nil
}

// queueDeclareErr explains a refused queue declaration.
func queueDeclareErr(queue string, t QueueType, err error) error {
	var ae *amqp091.Error
	if t == Quorum && errors.As(err, &ae) && ae.Code == amqp091.PreconditionFailed && strings.Contains(ae.Reason, "x-single-active-consumer") {
		return fmt.Errorf("idem: amqp: declare queue %q: the quorum queue exists without x-single-active-consumer "+
			"(declared by an earlier idem version or by hand), and RabbitMQ ignores exclusive consumers on quorum queues, "+
			"so several subscribers could consume it at once and break per-aggregate order. Migrate: with the subscribers "+
			"that run now, let the queue drain (idem status shows nothing waiting) while publishing is paused (stop the relays: "+
			"the outbox keeps the events), stop them, delete the queue (`rabbitmqctl delete_queue %s`), then start the new "+
			"subscribers, which declare it again, and the relays: %w", queue, queue, err)
	}
	return fmt.Errorf("idem: amqp: declare queue %q: %w", queue, err)
}
