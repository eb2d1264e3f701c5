package sqlite

import (
	"context"
	"errors"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idem-go/idem/driver/internal/dialectkit"
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
	if code, ok := resultCode(err); ok {
		switch code {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR,
			sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_PROTOCOL:
			return true
		}
		return false
	}
	return dialectkit.IsConnectionError(err)
}

// IsBusy reports whether err is SQLite's SQLITE_BUSY ("database is
// locked"): the busy timeout ran out while another connection held the
// write lock. It reads the primary result code of a *sqlite.Error.
func IsBusy(err error) bool {
	code, ok := resultCode(err)
	return ok && code == sqlite3.SQLITE_BUSY
}

// isMissingTable reports whether err is SQLite's "no such table". SQLite
// has no result code of its own for it: the statement fails to prepare
// with the generic SQLITE_ERROR, as a syntax error or a missing column
// does, and only sqlite3_errmsg, which the error's text carries ("SQL logic
// error: no such table: outbox (1)"), names the cause. The code confines
// the match to that class of error; the message then tells which.
func isMissingTable(err error) bool {
	var sErr *sqlite.Error
	return errors.As(err, &sErr) && sErr.Code()&0xff == sqlite3.SQLITE_ERROR &&
		strings.Contains(sErr.Error(), "no such table: ")
}

// resultCode returns the primary result code of the *sqlite.Error in err's
// chain, if any (the extended codes, such as SQLITE_BUSY_SNAPSHOT, keep it
// in their low byte).
func resultCode(err error) (int, bool) {
	var sErr *sqlite.Error
	if !errors.As(err, &sErr) {
		return 0, false
	}
	return sErr.Code() & 0xff, true
}
