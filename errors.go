package idem

import (
	"errors"
	"fmt"
)

// ErrNotFound is returned by lookups that find no row: a parked message, a
// quarantined outbox row.
var ErrNotFound = errors.New("idem: not found")

// ErrMissingTable is returned (wrapped) when an idem table does not exist. The
// message tells the operator to run "idem migrate up".
var ErrMissingTable = errors.New("idem table missing: run \"idem migrate up\" against this database")

// ErrUndecodable is matched (errors.Is) by every error that says a message body
// or its headers cannot be turned into an Event. Such a message is never retried:
// it goes to the failure store with its raw bytes.
var ErrUndecodable = errors.New("idem: undecodable message")

// FieldError says which field of an event or envelope is wrong and how.
type FieldError struct {
	// Field is the wire name of the field ("event_id", "payload", "body").
	Field string
	// Problem says what is wrong, as a phrase: "is missing", "is not a UUID".
	Problem string
}

// Error implements error.
func (e *FieldError) Error() string { return fmt.Sprintf("%s %s", e.Field, e.Problem) }

// DecodeError is returned when a received message cannot be decoded. It wraps
// the FieldError that names the problem and matches ErrUndecodable.
type DecodeError struct {
	Err error
}

// Error implements error.
func (e *DecodeError) Error() string { return "idem: undecodable message: " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *DecodeError) Unwrap() error { return e.Err }

// Is reports whether target is ErrUndecodable.
func (e *DecodeError) Is(target error) bool { return target == ErrUndecodable }

// permanentError marks a handler error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err to say that retrying the event cannot succeed (a payload
// the handler rejects, a reference that will never exist). The consumer sends
// the message straight to the failure store instead of retrying it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was made by Permanent
// or is an undecodable-message error.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p) || errors.Is(err, ErrUndecodable)
}

// transientError marks an error that retrying later can fix.
type transientError struct{ err error }

func (e *transientError) Error() string { return "transient: " + e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// Transient wraps err to say that the failure comes from a dependency that is
// away for now (a downstream service answering 503 or refusing connections, a
// lock held elsewhere) and that the same event will succeed later. The
// consumer retries it with a capped backoff for as long as its outage budget
// allows, without counting attempts toward the failure store, and pauses
// consumption meanwhile. Errors of the consumer's own database that say the
// same (connection lost, serialization failure, deadlock...) and network
// errors are recognised without it.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err: err}
}

// IsTransient reports whether err, or an error it wraps, was made by
// Transient.
func IsTransient(err error) bool {
	var t *transientError
	return errors.As(err, &t)
}

// ErrStarted is returned by the Start method of a service (a relay, a
// subscriber, a purger, the dashboard...) that was started before.
var ErrStarted = errors.New("idem: already started")

// ErrStopped is returned by the Start method of a service that was stopped:
// a service cannot start again after Stop; make a new one.
var ErrStopped = errors.New("idem: stopped: a service cannot start again after Stop; make a new one")
