package mysqlrepl

import (
	"errors"
	"fmt"
)

// ErrChecksum is wrapped by the error of an event whose CRC32 does not match
// its bytes (a corrupted stream or binlog file). The wrapping error names the
// event's type, binlog file and end position.
var ErrChecksum = errors.New("idem: mysqlrepl: event checksum mismatch")

// ErrUnsupported is wrapped by the error of an event or a column this package
// refuses rather than misreads: MySQL's partial JSON updates and tagged
// GTIDs, MariaDB compressed events (log_bin_compress), pre-5.6 temporal
// types.
var ErrUnsupported = errors.New("idem: mysqlrepl: unsupported")

// ErrMalformed is wrapped by the error of an event whose bytes do not decode
// (truncated, a length out of bounds, a value out of range).
var ErrMalformed = errors.New("idem: mysqlrepl: malformed event")

// ServerError is an ERR packet the server sent.
type ServerError struct {
	// Code is the server's error number (1045 access denied, 1236 binlog
	// position unavailable...).
	Code uint16
	// State is the SQLSTATE (5 characters), "" when the server sent none.
	State string
	// Message is the server's text.
	Message string
}

// Error returns "mysql: Error 1045 (28000): ..." like the go-sql-driver.
func (e *ServerError) Error() string {
	if e.State == "" {
		return fmt.Sprintf("mysql: Error %d: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("mysql: Error %d (%s): %s", e.Code, e.State, e.Message)
}

// ErrCodeBinlogUnavailable is ER_MASTER_FATAL_ERROR_READING_BINLOG (1236),
// which MariaDB and MySQL send on the dump connection when they cannot
// serve the requested position.
const ErrCodeBinlogUnavailable = 1236

// IsPurged reports whether err is the server refusing the requested binlog
// position: error 1236 (ER_MASTER_FATAL_ERROR_READING_BINLOG). MariaDB sends
// it, on the first read after StartDump, when the GTID position is in a
// binlog already purged, when the position's GTID is not in its binlog at all
// (a sequence the server never wrote, for example), and when the replica's
// position has diverged; its message says which. In every case the reader
// cannot resume from that position: it needs a new snapshot or an operator.
// MySQL sends it when the GTID set lacks transactions the server purged
// ("Cannot replicate because the source purged required binary logs...")
// and when the set holds transactions the server never had (a replica
// ahead of its source).
func IsPurged(err error) bool {
	var se *ServerError
	return errors.As(err, &se) && se.Code == ErrCodeBinlogUnavailable
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, args...)...)
}
