package idem

import (
	"github.com/google/uuid"
)

// Header names idem reads and writes on transports.
const (
	// HeaderEventID carries the event id, as Debezium's Outbox Event Router
	// does (header "id").
	HeaderEventID = "id"
	// HeaderEventType carries the event name, as Debezium's Event Router does
	// with table.fields.additional.placement=type:header:eventType.
	HeaderEventType = "eventType"
	// HeaderAttempt carries the delivery attempt number (1 for the first
	// delivery) on transports where idem republishes retries itself.
	HeaderAttempt = "idem-attempt"
	// HeaderRedrive carries, on a message that "idem failed retry" sent
	// again, the failure store id of the parked message it re-drives. The
	// consumer removes that entry once the message is applied, parks the
	// message again in that entry if it fails again, and lets the message
	// through the aggregates held by messages parked after it. It acts on
	// the header only when the entry is its own and holds the message's
	// body; the header itself is never stored.
	HeaderRedrive = "idem-redrive"
	// ContentTypeJSON is the content type of envelope bodies.
	ContentTypeJSON = "application/json"
	// ContentTypeOctetStream is the content type of bytes of no named type:
	// a received payload_base64 or CloudEvent data_base64 without a content
	// type is taken for it.
	ContentTypeOctetStream = "application/octet-stream"
)

// Message is an event as a broker carries it. Outgoing messages are made from
// an Event by NewMessage (or from a stored raw message when one is retried);
// incoming messages are filled by a transport and turned into an Event by a
// Decoder.
type Message struct {
	// EventID is the event id. Transports map it to their own id property
	// (RabbitMQ message_id, NATS Nats-Msg-Id, Kafka header "id").
	EventID uuid.UUID
	// EventName is the event name: RabbitMQ routing key, NATS subject suffix,
	// Kafka header "eventType".
	EventName string
	// AggregateType routes Kafka records (outbox.event.<aggregate_type>).
	AggregateType string
	// Key is the aggregate id: the Kafka record key. Transports without keys
	// ignore it.
	Key []byte
	// Headers are string headers carried with the message.
	Headers map[string]string
	// Body is the encoded message body: the JSON envelope, or for messages
	// produced by Debezium, the bare payload.
	Body []byte
}

// NewMessage encodes ev as an envelope message ready to publish.
func NewMessage(ev Event) (Message, error) {
	body, err := MarshalEnvelope(ev)
	if err != nil {
		return Message{}, err
	}
	var headers map[string]string
	if len(ev.Headers) > 0 {
		headers = make(map[string]string, len(ev.Headers))
		for k, v := range ev.Headers {
			headers[k] = v
		}
	}
	return Message{
		EventID:       ev.ID,
		EventName:     ev.Name,
		AggregateType: ev.AggregateType,
		Key:           []byte(ev.AggregateID),
		Headers:       headers,
		Body:          body,
	}, nil
}
