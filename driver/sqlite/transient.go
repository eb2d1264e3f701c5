package sqlite

import (
	"context"
	"errors"

	"github.com/idem-go/idem/driver/internal/dialectkit"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// IsTransient reports whether err says that the database is busy or away
// for now: a *sqlite.Error whose primary result code is SQLITE_BUSY (another
// connection holds the write lock past the busy timeout), SQLITE_LOCKED,
// SQLITE_FULL (disk full), SQLITE_IOERR, SQLITE_NOMEM or SQLITE_PROTOCOL;
// or any error of dialectkit.IsConnectionError. A context cancelled by the
// caller is not transient. Other errors (constraint violations, syntax
// errors...) are not.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var sErr *sqlite.Error
	if errors.As(err, &sErr) {
		switch sErr.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR,
			sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_PROTOCOL:
			return true
		}
		return false
	}
	return dialectkit.IsConnectionError(err)
}
