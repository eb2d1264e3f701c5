package amqp

import (
	"fmt"

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
