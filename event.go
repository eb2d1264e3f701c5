package idem

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Event is one domain event: a fact a service committed and other services
// react to. Its ID is set once by the producer and travels unchanged through the
// outbox, the broker, retries, the failure store and replays; consumers
// deduplicate on it.
type Event struct {
	// ID identifies the event. It is a UUIDv7 made by the producer with
	// NewEventID, never generated on receipt.
	ID uuid.UUID
	// Name is the event name, <service>.<aggregate>.<event>.v<N>, for example
	// "order.order.placed.v1". It is the RabbitMQ routing key and the NATS
	// subject suffix.
	Name string
	// OccurredAt is when the producer recorded the event. It is encoded in UTC
	// with microsecond precision.
	OccurredAt time.Time
	// AggregateType is the kind of entity the event is about ("order"). Kafka
	// topics are derived from it (outbox.event.<aggregate_type>).
	AggregateType string
	// AggregateID identifies the entity ("42"). Events of one aggregate are
	// published and handled in commit order; it is the Kafka message key.
	AggregateID string
	// AggregateVersion is the version of the aggregate after this event, when
	// the producer tracks one (0 when unknown). Consumers that keep a copy of the
	// aggregate's state use it to ignore late, older events.
	AggregateVersion int64
	// ContentType is the media type of Payload. Empty, or a JSON media type
	// (application/json, text/json, any +json type; IsJSONContentType), means
	// that Payload is JSON, as for every event before content types existed.
	// Any other type ("application/x-protobuf", "application/avro",
	// "application/octet-stream") means that Payload holds raw bytes, which
	// idem stores, publishes and hands to handlers unchanged.
	ContentType string
	// Payload is the event body: JSON when ContentType is empty or a JSON
	// type, else the raw bytes of ContentType. Its type stays
	// json.RawMessage for compatibility; with a non-JSON content type it is
	// only a byte slice (never give it to encoding/json as it is).
	Payload json.RawMessage
	// Headers are optional string metadata carried as transport headers.
	Headers map[string]string
	// NotBefore, when set, delays the event: the relay publishes it at or
	// after that time, not before (a reminder, a cancellation window, a
	// saga's timeout). The zero time, or a time already passed when the
	// event is added to the outbox, means at once. It is kept in the
	// outbox's not_before column and is not part of the message: consumers
	// receive the event as any other, and NotBefore is zero on the events
	// they decode.
	//
	// A delayed event does not hold back the later events of its
	// aggregate: they are published when they are due, and the delayed one
	// when it is, after them. Delay every event of the aggregate, or none,
	// where their order matters.
	NotBefore time.Time
}

// NewEventID returns a new UUIDv7 event id. UUIDv7 ids sort by creation time,
// which keeps the outbox and processed_event indexes compact.
func NewEventID() uuid.UUID {
	return uuid.Must(uuid.NewV7())
}

// NewEvent returns an Event with a fresh id, the current time, and payload
// encoded as JSON. It is a convenience for producers; every field can also be
// set directly.
func NewEvent(name, aggregateType, aggregateID string, payload any) (Event, error) {
	raw, err := json.Marshal(payload)
	if err != nil {
		return Event{}, fmt.Errorf("idem: encode payload of %s: %w", name, err)
	}
	return Event{
		ID:            NewEventID(),
		Name:          name,
		OccurredAt:    time.Now().UTC(),
		AggregateType: aggregateType,
		AggregateID:   aggregateID,
		Payload:       raw,
	}, nil
}

// Validate reports the first problem that would stop the event from being
// written to an outbox or encoded: a missing id, name, aggregate type or id, a
// content type that is not a media type, or, when the content type is JSON
// (IsJSONContentType), a payload that is not JSON. A payload of another
// content type is not checked.
func (e Event) Validate() error {
	switch {
	case e.ID == uuid.Nil:
		return &FieldError{Field: "event_id", Problem: "is missing (use idem.NewEventID)"}
	case e.Name == "":
		return &FieldError{Field: "event_name", Problem: "is missing"}
	case e.AggregateType == "":
		return &FieldError{Field: "aggregate_type", Problem: "is missing"}
	case e.AggregateID == "":
		return &FieldError{Field: "aggregate_id", Problem: "is missing"}
	case e.AggregateVersion < 0:
		return &FieldError{Field: "aggregate_version", Problem: "is negative"}
	case e.ContentType != "" && !validContentType(e.ContentType):
		return &FieldError{Field: "content_type", Problem: fmt.Sprintf("%q is not a media type (type/subtype)", truncate(e.ContentType, 64))}
	case IsJSONContentType(e.ContentType) && len(e.Payload) > 0 && !json.Valid(e.Payload):
		return &FieldError{Field: "payload", Problem: "is not valid JSON"}
	}
	return nil
}

// IsJSON reports whether e's payload is JSON: its content type is empty or a
// JSON media type (IsJSONContentType).
func (e Event) IsJSON() bool { return IsJSONContentType(e.ContentType) }

// IsJSONContentType reports whether a content type says JSON: empty (idem's
// default), application/json, text/json or any +json type, in any case and
// with any parameters ("application/json; charset=utf-8").
func IsJSONContentType(ct string) bool {
	return ct == "" || isJSONMediaType(mediaType(ct))
}

// validContentType reports whether ct looks like a media type: printable
// ASCII, at most 255 bytes, type/subtype before any parameters.
func validContentType(ct string) bool {
	if len(ct) > 255 {
		return false
	}
	for i := 0; i < len(ct); i++ {
		if ct[i] < ' ' || ct[i] > '~' {
			return false
		}
	}
	t, sub, ok := strings.Cut(mediaType(ct), "/")
	return ok && t != "" && sub != "" && !strings.ContainsAny(t+sub, " /")
}
