package inbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
)

// JSONHandlerFunc handles an event whose JSON payload was decoded into a T
// (HandleJSON). payload is a fresh value for each call.
type JSONHandlerFunc[TTx, T any] func(ctx context.Context, tx TTx, ev idem.Event, payload T) error

// HandleJSON registers h for events named eventName on c, with their
// payload decoded into a T by DecodeJSON: strictly, and checked by T's
// Validate method when it has one. A payload that does not decode or
// validate never reaches h: it is a permanent failure (a *PayloadError
// marked idem.Permanent, naming the event and the field), and the consumer
// parks the message at once, without retrying it. T's type is given, TTx is
// the consumer's:
//
//	inbox.HandleJSON(c, "order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event, o OrderPlaced) error {
//		...
//	})
func HandleJSON[T, TTx any](c *Consumer[TTx], eventName string, h JSONHandlerFunc[TTx, T]) {
	c.Handle(eventName, func(ctx context.Context, tx TTx, ev idem.Event) error {
		p, err := DecodeJSON[T](ev)
		if err != nil {
			return err
		}
		return h(ctx, tx, ev, p)
	})
}

// DecodeJSON decodes the payload of ev into a T with the rules of
// HandleJSON:
//
//   - the event's content type is JSON (idem.Event.IsJSON: empty, or a JSON
//     media type): an event of another content type (Protobuf, Avro...) is
//     an error that names it;
//   - the payload is one JSON value of T's shape: a field T does not have,
//     a value of the wrong type, data after the value, an empty payload or
//     null is an error;
//   - then, when T or *T has a method Validate() error, it runs; an
//     *idem.FieldError it returns (or wraps) names the field.
//
// Its errors are *PayloadError values marked idem.Permanent: returned by a
// handler as they are, the consumer parks the message.
func DecodeJSON[T any](ev idem.Event) (T, error) {
	var p T
	if !ev.IsJSON() {
		return p, payloadError(ev, "", fmt.Errorf("the content type %q is not JSON: register the event with Consumer.Handle and decode its bytes (Event.Payload) there", ev.ContentType))
	}
	switch trimmed := bytes.TrimSpace(ev.Payload); {
	case len(trimmed) == 0:
		return p, payloadError(ev, "", errors.New("the payload is empty"))
	case string(trimmed) == "null":
		return p, payloadError(ev, "", errors.New("the payload is null"))
	}
	dec := json.NewDecoder(bytes.NewReader(ev.Payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, payloadError(ev, jsonField(err), err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return p, payloadError(ev, "", fmt.Errorf("data after the JSON value at offset %d", dec.InputOffset()))
	}
	var err error
	switch v := any(&p).(type) {
	case interface{ Validate() error }:
		err = v.Validate()
	default:
		if v, ok := any(p).(interface{ Validate() error }); ok {
			err = v.Validate()
		}
	}
	if err != nil {
		var fe *idem.FieldError
		field := ""
		if errors.As(err, &fe) {
			field = fe.Field
		}
		return p, payloadError(ev, field, err)
	}
	return p, nil
}

// PayloadError says why an event's payload cannot be handled (DecodeJSON):
// it is not the JSON its name promises, or it breaks its type's rules.
// Retrying cannot fix it.
type PayloadError struct {
	// EventID and EventName identify the event.
	EventID   uuid.UUID
	EventName string
	// Field is the field at fault, as JSON names it ("lines[2].quantity",
	// "customerId"), when known.
	Field string
	// Err is the problem.
	Err error
}

// Error implements error.
func (e *PayloadError) Error() string {
	where := ""
	if e.Field != "" {
		where = " (field " + e.Field + ")"
	}
	return fmt.Sprintf("idem: inbox: the payload of event %s (%s) cannot be handled%s: %v", e.EventID, e.EventName, where, e.Err)
}

// Unwrap returns the problem.
func (e *PayloadError) Unwrap() error { return e.Err }

func payloadError(ev idem.Event, field string, err error) error {
	return idem.Permanent(&PayloadError{EventID: ev.ID, EventName: ev.Name, Field: field, Err: err})
}

// jsonField returns the field an encoding/json error names, "" when none.
func jsonField(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return te.Field
	}
	// DisallowUnknownFields: `json: unknown field "name"`.
	if rest, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if name, err := strconv.Unquote(rest); err == nil {
			return name
		}
	}
	return ""
}
