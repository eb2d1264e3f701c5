// Package broker is the seam between idem and message brokers. A Publisher is
// what the relay (and the failure-store and replay commands) publish through;
// broker/amqp, broker/kafka and broker/nats implement it, with a Subscriber
// each; broker/webhook posts to an HTTP endpoint, and broker/memory is an
// in-process broker, publisher and subscriber, for tests, examples and
// benchmarks.
//
// Every implementation passes the conformance suite in broker/brokertest:
// broker/amqp, broker/kafka, broker/nats and broker/memory all of it
// (brokertest.Run) but for what their Features lack, broker/webhook, which
// has no subscriber, its publisher part (brokertest.RunPublisher).
package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redact"
)

// Publisher publishes messages durably.
type Publisher interface {
	// Publish sends msgs and returns only when the broker has durably
	// accepted or refused each of them (publisher confirms, acks=all).
	//
	// It returns nil when every message was accepted; a *BatchError when some
	// were refused, with one entry per message (nil where accepted); or any
	// other error, meaning no message may be taken as accepted. Messages of
	// one call may be delivered in any order; callers that need order wait
	// for one call to return before publishing what must come after.
	Publish(ctx context.Context, msgs []idem.Message) error
}

// BatchError reports which messages of a Publish call failed.
type BatchError struct {
	// Errs has one entry per message given to Publish: nil if the broker
	// accepted it, the reason otherwise.
	Errs []error
}

// Error implements error.
func (e *BatchError) Error() string {
	var failed int
	var first error
	for _, err := range e.Errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	return fmt.Sprintf("idem: %d of %d message(s) not accepted by the broker; first: %v", failed, len(e.Errs), first)
}

// Unwrap returns the per-message errors.
func (e *BatchError) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// Results turns the error of a Publish call over n messages into one error
// per message: all nil for nil, the BatchError's entries, or err for every
// message otherwise.
func Results(err error, n int) []error {
	out := make([]error, n)
	if err == nil {
		return out
	}
	var be *BatchError
	if errors.As(err, &be) && len(be.Errs) == n {
		copy(out, be.Errs)
		return out
	}
	for i := range out {
		out[i] = err
	}
	return out
}

// IsFault reports whether a per-message error says that the broker did not
// answer for the message (a deadline, a cancellation, a lost connection, an
// error marked idem.Transient) rather than that it refused it (unroutable,
// nacked, rejected, too large). A relay retries faults for as long as they
// last, and counts only refusals toward quarantine: a broker away for a
// while must not get healthy messages parked.
func IsFault(err error) bool {
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		idem.IsTransient(err) || errors.As(err, &netErr) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// refusedError marks an error as the broker's refusal of a message.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// Refused wraps err to say that the broker (or endpoint) refused the
// messages of a Publish call itself: publishing them again as they are will
// not help (an HTTP 400 or 413, a message too large for the whole call).
// Returned by Publish as a whole-call error, it counts as a refusal of every
// message of the call, toward the relay's quarantine, instead of a fault
// that pauses the relay. Per-message errors in a *BatchError are refusals
// unless IsFault says otherwise, and need no mark.
func Refused(err error) error {
	if err == nil {
		return nil
	}
	return &refusedError{err: err}
}

// IsRefused reports whether err, or an error it wraps, was made by Refused.
func IsRefused(err error) bool {
	var r *refusedError
	return errors.As(err, &r)
}

// ErrUnroutable is returned (wrapped) for a message the broker accepted but
// could deliver to no queue or stream: publishing it again will not help until
// a binding exists, and the relay keeps the row.
var ErrUnroutable = errors.New("idem: message unroutable: no queue or stream is bound for it")

// RedactURL returns u without its secrets, for logs and errors: the
// password of its user information, a NATS token, and the value of every
// password or secret parameter (password=, sslpassword=, sasl_password=,
// secret=, client_secret=) become "xxxxx". It takes any text, so a MySQL DSN or an error that quotes a URL
// comes out clean too. It is the redaction of every idem command.
func RedactURL(u string) string { return redact.String(u) }
