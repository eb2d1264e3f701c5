package shop

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strings"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
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

// payload is what ForOrder needs of a payload type: its rules (run by
// inbox.DecodeJSON) and its order id (every shop event's aggregate id is
// the order id).
type payload interface {
	Validate() error
	orderID() string
}

// ForOrder returns h behind a check that the event's aggregate id, when it
// has one, is the payload's order id, for inbox.HandleJSON, which decodes
// the payload strictly and runs its Validate first:
//
//	inbox.HandleJSON(c, shop.OrderPlaced, shop.ForOrder(s.reserve))
//
// A payload that breaks the contract never reaches h: the consumer parks
// the message (a permanent *inbox.PayloadError), never applied and never
// retried.
func ForOrder[T payload](h inbox.JSONHandlerFunc[*sql.Tx, T]) inbox.JSONHandlerFunc[*sql.Tx, T] {
	return func(ctx context.Context, tx *sql.Tx, ev idem.Event, p T) error {
		if err := CheckOrder(ev, p); err != nil {
			return err
		}
		return h(ctx, tx, ev, p)
	}
}

// CheckOrder returns a permanent *inbox.PayloadError when ev's aggregate id
// is set and is not p's order id.
func CheckOrder[T payload](ev idem.Event, p T) error {
	if ev.AggregateID == "" || ev.AggregateID == p.orderID() {
		return nil
	}
	return idem.Permanent(&inbox.PayloadError{EventID: ev.ID, EventName: ev.Name, Field: "aggregate_id",
		Err: fieldError("aggregate_id", "%q is not the payload's orderId %q", ev.AggregateID, p.orderID())})
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
