// Package otelconv holds the span attribute keys that the relay's send
// spans and the consumer's process spans share: those of OpenTelemetry's
// messaging semantic conventions (v1.27 and later), and idem's own.
package otelconv

import "go.opentelemetry.io/otel/attribute"

// Messaging semantic conventions.
const (
	System        = attribute.Key("messaging.system")
	Destination   = attribute.Key("messaging.destination.name")
	OperationType = attribute.Key("messaging.operation.type")
	OperationName = attribute.Key("messaging.operation.name")
	MessageID     = attribute.Key("messaging.message.id")
	ConsumerGroup = attribute.Key("messaging.consumer.group.name")
)

// EventName is the event name, on both sides.
const EventName = attribute.Key("idem.event.name")
