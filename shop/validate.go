package shop

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
)

// MaxLines is the largest number of lines an order may have.
const MaxLines = 100

var (
	idRE       = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,100}$`)
	quantityRE = regexp.MustCompile(`^([0-9]{1,9})(?:\.([0-9]{1,3}))?$`)
)

// ValidID reports whether s can be a customer, product or carrier pickup id:
// 1 to 100 letters, digits, '.', '_', ':' or '-'. Order, preparation and
// invoice ids are UUIDs in their canonical form, made by the service that
// owns them.
func ValidID(s string) bool { return idRE.MatchString(s) }

// NormalizeQuantity checks a quantity, a positive decimal string with at
// most 9 digits before the point and 3 after, and writes it with three
// decimals ("2" -> "2.000", "002.5" -> "2.500").
func NormalizeQuantity(q string) (string, error) {
	m := quantityRE.FindStringSubmatch(q)
	if m == nil {
		return "", fmt.Errorf("quantity %q is not a decimal string such as \"2.000\" (at most 9 digits before the point and 3 after)", q)
	}
	intPart := strings.TrimLeft(m[1], "0")
	if intPart == "" {
		intPart = "0"
	}
	frac := m[2] + strings.Repeat("0", 3-len(m[2]))
	if intPart == "0" && frac == "000" {
		return "", fmt.Errorf("quantity %q must be positive", q)
	}
	return intPart + "." + frac, nil
}

// InvalidEventError says why an event's payload cannot be applied: it is
// not the JSON object its name promises, or a field breaks the contract
// (a missing or malformed id, no lines, a product on two lines, a quantity
// that is not a positive decimal...). Retrying cannot fix it: Decode wraps
// it with idem.Permanent, and the consumer parks the message.
type InvalidEventError struct {
	// EventID and EventName identify the event.
	EventID   uuid.UUID
	EventName string
	// Err is the problem, often an *idem.FieldError naming the field.
	Err error
}

// Error implements error.
func (e *InvalidEventError) Error() string {
	return fmt.Sprintf("shop: event %s (%s) cannot be applied: %v; fix its producer, then remove the parked message (idem failed remove)",
		e.EventID, e.EventName, e.Err)
}

// Unwrap returns the problem.
func (e *InvalidEventError) Unwrap() error { return e.Err }

// payload is what Decode needs of a payload type: its rules and its order
// id (every shop event's aggregate id is the order id).
type payload interface {
	Validate() error
	orderID() string
}

// Decode returns the payload of ev as a T, checked by T's Validate method
// and against the event's aggregate id (the order id, when the event has
// one). A payload that is not a JSON object of T's shape (a field of the
// wrong type, not an object at all) or breaks its rules is reported as
// idem.Permanent(*InvalidEventError): a handler returns that error as is,
// and the consumer parks the message in its failure store, never applied
// and never retried.
func Decode[T payload](ev idem.Event) (T, error) {
	var p T
	if err := json.Unmarshal(ev.Payload, &p); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			err = fmt.Errorf("payload is not JSON: %v", err)
		} else {
			err = fmt.Errorf("payload does not have the shape of %s: %v", ev.Name, err)
		}
		return p, invalid(ev, err)
	}
	if err := p.Validate(); err != nil {
		return p, invalid(ev, err)
	}
	if ev.AggregateID != "" && ev.AggregateID != p.orderID() {
		return p, invalid(ev, fieldError("aggregate_id", "%q is not the payload's orderId %q", ev.AggregateID, p.orderID()))
	}
	return p, nil
}

func invalid(ev idem.Event, err error) error {
	return idem.Permanent(&InvalidEventError{EventID: ev.ID, EventName: ev.Name, Err: err})
}

func fieldError(field, format string, args ...any) error {
	return &idem.FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

func linesField(i int, name string) string { return fmt.Sprintf("lines[%d].%s", i, name) }

func checkID(field, s string) error {
	if s == "" {
		return fieldError(field, "is missing")
	}
	if !ValidID(s) {
		return fieldError(field, "%q is not 1 to 100 letters, digits, '.', '_', ':' or '-'", truncate(s))
	}
	return nil
}

// checkUUID accepts a UUID in its canonical form only (lower-case, with
// hyphens), the one the shop's services write: two spellings of one UUID
// would be two keys in the consumers' tables.
func checkUUID(field, s string) error {
	if s == "" {
		return fieldError(field, "is missing")
	}
	if u, err := uuid.Parse(s); err != nil || u.String() != s {
		return fieldError(field, "%q is not a UUID such as \"0193a0e4-5b7c-7d7e-8f90-a1b2c3d4e5f6\"", truncate(s))
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}
