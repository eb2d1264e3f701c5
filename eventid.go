package idem

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/google/uuid"
)

// The rule for outbox ids that are not UUIDs (EventID).
const (
	// EventIDNamespace is the namespace of the name-based (version 5) UUIDs
	// EventID derives from outbox ids that are not UUIDs. It is itself the
	// version 5 UUID of the URL "https://github.com/idem-go/idem#event-id"
	// in the URL namespace of RFC 9562. It never changes: the event ids
	// consumers have recorded depend on it.
	EventIDNamespace = "5b3a9922-e3a3-5567-9832-a5512c352159"
	// EventIDMaxBytes is the longest outbox id, in bytes, that is not a
	// UUID and that EventID accepts: the width of Debezium's
	// "id VARCHAR(64)" and of idem's MySQL/MariaDB id column.
	EventIDMaxBytes = 64
	// HeaderOriginalID carries, on a message whose event id EventID derived
	// from an outbox id that is not a UUID, that id as its writer wrote it.
	// The relays set it (replacing a header of that name in the row) and
	// set it only then; consumers deduplicate on the event id, and
	// EventID(header) gives it back. The Decoder sets it the same way on
	// the event of a Debezium record or a CloudEvent whose id is not a
	// UUID, so that handlers see it whichever path published the row.
	HeaderOriginalID = "idem-original-id"
)

var eventIDNamespace = uuid.MustParse(EventIDNamespace)

// EventIDError says why an outbox id cannot become an event id (EventID).
type EventIDError struct {
	// ID is the id as written.
	ID string
	// Problem says what is wrong, as a phrase: "is empty", "is 65 bytes
	// long, ...".
	Problem string
}

// Error implements error.
func (e *EventIDError) Error() string {
	return "idem: event id: " + quoteID(e.ID) + " " + e.Problem
}

// quoteID quotes an id in Go syntax (whatever bytes it holds), cut after
// 100 bytes.
func quoteID(raw string) string {
	if len(raw) > 100 {
		return strconv.Quote(raw[:100]) + "..."
	}
	return strconv.Quote(raw)
}

// EventID returns the event id of an outbox row (or WAL message) whose id
// column holds raw. It is the rule every relay applies, on every dialect,
// and the one the Decoder applies to the id of a Debezium record (its "id"
// header, the row's id as Debezium copied it) or of a CloudEvent, so that
// a writer or a consumer can compute the id itself:
//
//   - raw that uuid.Parse reads is that UUID: the canonical 36-character
//     form, in any case, and the other spellings uuid.Parse accepts
//     (braces, a "urn:uuid:" prefix, 32 hexadecimal digits), which the
//     relays published as that UUID before this rule. The nil UUID is an
//     error.
//   - any other raw of 1 to EventIDMaxBytes (64) bytes that is valid UTF-8
//     without ASCII control characters (bytes 0x00 to 0x1f and 0x7f, which
//     transports' headers cannot all carry) gives the name-based UUID
//     (version 5) of its bytes, exactly as written (no trimming, no case
//     folding), in the namespace EventIDNamespace:
//     uuid.NewSHA1(uuid.MustParse(EventIDNamespace), []byte(raw)). The
//     relays publish the message under that id and put raw in the header
//     HeaderOriginalID.
//   - anything else (empty, longer than 64 bytes, not UTF-8, with a control
//     character) is an *EventIDError: the relays quarantine the row, with
//     the error's problem as the reason.
func EventID(raw string) (uuid.UUID, error) {
	id, _, err := eventID(raw)
	return id, err
}

// IsDerivedEventID reports whether EventID derives the event id of raw
// (raw is a valid id that is not a UUID): a message made from it carries
// HeaderOriginalID.
func IsDerivedEventID(raw string) bool {
	_, derived, err := eventID(raw)
	return err == nil && derived
}

// decodeEventID is EventID for the decoder: an id it refuses is an
// undecodable message, the error naming field and quoting the id.
func decodeEventID(field, raw string) (id uuid.UUID, derived bool, err error) {
	id, derived, err = eventID(raw)
	if err != nil {
		problem := err.Error()
		var ie *EventIDError
		if errors.As(err, &ie) {
			problem = ie.Problem
		}
		return uuid.Nil, false, decodeErr(field, quoteID(raw)+" "+problem)
	}
	return id, derived, nil
}

func eventID(raw string) (id uuid.UUID, derived bool, err error) {
	if u, err := uuid.Parse(raw); err == nil {
		if u == uuid.Nil {
			return uuid.Nil, false, &EventIDError{ID: raw, Problem: "is the nil UUID"}
		}
		return u, false, nil
	}
	const rule = "an event id is a UUID, or 1 to 64 bytes of UTF-8 text without control characters"
	switch {
	case raw == "":
		return uuid.Nil, false, &EventIDError{ID: raw, Problem: "is empty: " + rule}
	case len(raw) > EventIDMaxBytes:
		return uuid.Nil, false, &EventIDError{ID: raw, Problem: fmt.Sprintf("is %d bytes long, more than %d: %s", len(raw), EventIDMaxBytes, rule)}
	case !utf8.ValidString(raw):
		return uuid.Nil, false, &EventIDError{ID: raw, Problem: "is not valid UTF-8: " + rule}
	}
	for i := 0; i < len(raw); i++ {
		if b := raw[i]; b < 0x20 || b == 0x7f {
			return uuid.Nil, false, &EventIDError{ID: raw, Problem: fmt.Sprintf("holds the control character %#02x: %s", b, rule)}
		}
	}
	return uuid.NewSHA1(eventIDNamespace, []byte(raw)), true, nil
}
