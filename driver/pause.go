package driver

import (
	"context"

	"github.com/idem-go/idem"
)

// Pauses is the part of a Dialect that keeps the operators' pauses of
// consumers and relays (idem.Pause), in the table of migration 0015
// (Tables.ConsumerPause). The conformance suite (drivertest.Pauses) checks
// it. Each method is one statement on ex, which is meant to be the pool.
type Pauses interface {
	// SetPause records p, replacing the pause of the same kind and name if
	// there is one. Times are stored to the microsecond; a zero At is the
	// database's current time.
	SetPause(ctx context.Context, ex Executor, p idem.Pause) error
	// DeletePause removes the pause of kind and name, and reports whether
	// there was one.
	DeletePause(ctx context.Context, ex Executor, kind idem.PauseKind, name string) (bool, error)
	// ListPauses returns the pauses of kind and name, of every name of kind
	// when name is "", or of every kind when kind is also "", ended ones
	// included, sorted by kind then name.
	ListPauses(ctx context.Context, ex Executor, kind idem.PauseKind, name string) ([]idem.Pause, error)
}
