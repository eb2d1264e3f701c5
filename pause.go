package idem

import (
	"errors"
	"fmt"
	"time"
)

// PauseKind says what a Pause stops.
type PauseKind string

// Pause kinds.
const (
	// PauseConsumer stops a consumer: Pause.Name is the consumer's name.
	PauseConsumer PauseKind = "consumer"
	// PauseRelay stops the relays of an outbox: Pause.Name is the outbox
	// table's name (Tables.Outbox, without its schema).
	PauseRelay PauseKind = "relay"
)

// Pause is an operator's pause of a consumer or a relay, as the
// consumer_pause table keeps it (Tables.ConsumerPause). A consumer or relay
// reads it from its own database, so that every replica sees it and it
// survives restarts: while it is active, a consumer takes no message (it
// hands each back to its transport without counting an attempt) and a relay
// publishes nothing, keeping its position.
type Pause struct {
	// Kind and Name say what is paused.
	Kind PauseKind
	Name string
	// From is when the pause begins; zero means at once (a pause scheduled
	// for later otherwise).
	From time.Time
	// Until is when the pause ends by itself; zero means until resumed.
	Until time.Time
	// Reason says why, for "idem status" and the dashboard ("carrier
	// maintenance").
	Reason string
	// By says who paused ("alice", "dashboard"), for the same.
	By string
	// At is when the pause was recorded.
	At time.Time
}

// ActiveAt reports whether p stops its consumer or relay at t: From (if
// set) is not after t and Until (if set) is after it.
func (p Pause) ActiveAt(t time.Time) bool {
	return (p.From.IsZero() || !t.Before(p.From)) && (p.Until.IsZero() || t.Before(p.Until))
}

// EndedAt reports whether p has ended by itself at t (Until is set and not
// after t): it will never stop anything again.
func (p Pause) EndedAt(t time.Time) bool {
	return !p.Until.IsZero() && !t.Before(p.Until)
}

// Validate checks the times and texts of p: Until after From when both are
// set, a reason of at most 1000 bytes and a By of at most 200.
func (p Pause) Validate() error {
	switch {
	case !p.From.IsZero() && !p.Until.IsZero() && !p.Until.After(p.From):
		return fmt.Errorf("idem: pause: until %s is not after from %s", p.Until.Format(time.RFC3339), p.From.Format(time.RFC3339))
	case len(p.Reason) > 1000:
		return errors.New("idem: pause: the reason is longer than 1000 bytes")
	case len(p.By) > 200:
		return errors.New("idem: pause: by is longer than 200 bytes")
	}
	return nil
}
