package dialectkit

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"io"
	"net"
	"syscall"
)

// IsConnectionError reports whether err says that the connection to the
// database could not be made, broke, or timed out: a net.Error (refused,
// reset, unreachable, DNS, I/O timeouts), ECONNREFUSED, ECONNRESET,
// ECONNABORTED, EPIPE, ETIMEDOUT, an unexpected end of the stream,
// database/sql's ErrBadConn and ErrConnDone, or context.DeadlineExceeded.
// Every dialect's IsTransient includes it. It looks at error types and
// values, never at messages.
func IsConnectionError(err error) bool {
	if err == nil {
		return false
	}
	for _, target := range []error{
		context.DeadlineExceeded, io.ErrUnexpectedEOF, sqldriver.ErrBadConn, sql.ErrConnDone,
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE, syscall.ETIMEDOUT,
		syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ENETDOWN,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	var netErr net.Error
	return errors.As(err, &netErr)
}
