package postgres

import (
	"context"
	"errors"

	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/jackc/pgx/v5/pgconn"
)

// IsTransient reports whether err says that PostgreSQL is away for now or
// that the transaction lost a race that running it again resolves. It
// reads pgx's error types and the SQLSTATE codes:
//
//   - class 08, connection exception;
//   - class 53, insufficient resources (53100 disk full, 53300 too many
//     connections...);
//   - 57P01, 57P02, 57P03: the server shutting down, crashed, or starting;
//     57P05 and 25P03: the session closed by an idle timeout; 57014: a
//     statement timeout;
//   - 40001 serialization failure, 40P01 deadlock, 55P03 lock not available
//     (lock_timeout);
//   - 25006, a read-only transaction: a standby that was the primary;
//
// and, without a SQLSTATE, pgconn's connection errors, timeouts and errors
// it reports safe to retry (nothing was sent), and every error of
// dialectkit.IsConnectionError. A context cancelled by the caller is not
// transient. Other server errors (constraint violations, syntax errors...)
// are not.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return transientCode(pgErr.Code)
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) || dialectkit.IsConnectionError(err)
}

func transientCode(code string) bool {
	if len(code) == 5 && (code[:2] == "08" || code[:2] == "53") {
		return true
	}
	switch code {
	case "57P01", "57P02", "57P03", "57P05", "25P03", "57014",
		"40001", "40P01", "55P03",
		"25006":
		return true
	}
	return false
}
