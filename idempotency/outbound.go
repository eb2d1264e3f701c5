package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/idem-go/idem"
)

// AttemptsDefault is how many times Do sends a call at most, by default:
// once, then once more with the same key when the first answer was lost
// and a lookup found nothing. Longer outages are the caller's retry
// policy's (an inbox consumer pauses on idem.Transient).
const AttemptsDefault = 2

// Call is an outbound operation with an effect outside the database (a
// carrier's pickup, an e-mail, a payment), made safe to repeat by a stable
// idempotency key: the remote service does the work once per key, whatever
// the number of attempts.
type Call[T any] struct {
	// Key is the operation's idempotency key: the same at every attempt
	// of the operation, in every process, and different for every other
	// operation. Derive it from what identifies the operation, never from
	// the attempt: "shipment:42:initial" (see StableKey). Required; it
	// must be a valid key (ValidateKey).
	Key string
	// Send makes one attempt with key and returns its result. Its errors
	// say what retrying can do: wrapped with idem.Permanent when the
	// remote refused the request (a 4xx: retrying cannot help), with
	// idem.Transient when the remote is away for now (see ClassifyStatus
	// and ClassifyTransport). Required.
	Send func(ctx context.Context, key string) (T, error)
	// Lookup looks for the effect of an earlier attempt whose answer was
	// lost, by what the operation is about (an order's reference), and
	// reports whether it found one. Optional: without it, a lost answer
	// is met by sending again with the same key, which suffices with a
	// remote that replays its answer per key.
	Lookup func(ctx context.Context) (v T, found bool, err error)
	// Attempts is how many times Send is called at most. Defaults to
	// AttemptsDefault (2).
	Attempts int
	// Logger, when set, logs a result found by Lookup after a lost answer.
	Logger *slog.Logger
}

// Do makes the call c: Send with c.Key; when it fails without a refusal
// (any error but an idem.Permanent one, unless ctx is done), the outcome is
// unknown: the work may have been done and the answer lost. Do then calls
// Lookup, returns what it finds, and otherwise sends again with the same
// key, up to c.Attempts sends. It returns the last attempt's result and
// error as Send returned them; a failed lookup returns its error (wrapped,
// so that it keeps its classification) with the lost answer's.
func Do[T any](ctx context.Context, c Call[T]) (T, error) {
	var zero T
	if err := ValidateKey(c.Key); err != nil {
		return zero, idem.Permanent(fmt.Errorf("idem: idempotency: Call.Key %q: %w", c.Key, err))
	}
	if c.Send == nil {
		return zero, idem.Permanent(errors.New("idem: idempotency: Call.Send is nil"))
	}
	attempts := cmp.Or(c.Attempts, AttemptsDefault)
	for attempt := 1; ; attempt++ {
		v, err := c.Send(ctx, c.Key)
		if err == nil || ctx.Err() != nil || idem.IsPermanent(err) || attempt >= attempts {
			return v, err
		}
		if c.Lookup == nil {
			continue
		}
		found, ok, lerr := c.Lookup(ctx)
		if lerr != nil {
			return zero, fmt.Errorf("idem: idempotency: answer to %s lost (%v) and the lookup failed: %w", c.Key, err, lerr)
		}
		if ok {
			if c.Logger != nil {
				c.Logger.Info("answer lost; the effect of an earlier attempt found by lookup", "key", c.Key, "error", err)
			}
			return found, nil
		}
	}
}

// StableKey joins the parts naming an operation into its idempotency key:
// StableKey("shipment", "42", "initial") is "shipment:42:initial". Use
// what identifies the operation (its kind, the aggregate's id, the step),
// never anything that changes between attempts.
func StableKey(parts ...string) string { return strings.Join(parts, ":") }

// ClassifyStatus wraps err, the failure of a call answered with HTTP status
// code, with what a retry can do: 408, 409 (a request with the same key
// still running), 425, 429 and 5xx say that the remote cannot answer now
// (idem.Transient); any other 4xx says that this request will never
// succeed (idem.Permanent). Other codes leave err as it is.
func ClassifyStatus(code int, err error) error {
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusConflict, code == http.StatusTooEarly,
		code == http.StatusTooManyRequests, code >= 500:
		return idem.Transient(err)
	case code >= 400:
		return idem.Permanent(err)
	}
	return err
}

// ClassifyTransport wraps err, the failure of an HTTP exchange itself, with
// idem.Transient when it says the remote is away for now: a refused, reset
// or dropped connection, an answer cut short, a timeout, a name that does
// not resolve. When ctx is done, the caller gave up: err is returned as it
// is, and so is any other error.
func ClassifyTransport(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	var (
		netErr net.Error
		opErr  *net.OpError
		dnsErr *net.DNSError
	)
	switch {
	case errors.As(err, &netErr) && netErr.Timeout(),
		errors.As(err, &opErr), errors.As(err, &dnsErr),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return idem.Transient(err)
	}
	return err
}
