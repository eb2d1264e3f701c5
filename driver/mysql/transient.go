package mysql

import (
	"context"
	"errors"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem/driver/internal/dialectkit"
)

// transientErrors are the MySQL and MariaDB server error numbers that say
// the server is away for now or that the transaction lost a race.
var transientErrors = map[uint16]bool{
	1020: true, // ER_CHECKREAD: record changed since last read (snapshot isolation)
	1021: true, // ER_DISK_FULL
	1037: true, // ER_OUTOFMEMORY
	1040: true, // ER_CON_COUNT_ERROR: too many connections
	1041: true, // ER_OUT_OF_RESOURCES
	1053: true, // ER_SERVER_SHUTDOWN
	1114: true, // ER_RECORD_FILE_FULL: table full (disk or tablespace)
	1158: true, // ER_NET_READ_ERROR
	1159: true, // ER_NET_READ_INTERRUPTED
	1160: true, // ER_NET_ERROR_ON_WRITE
	1161: true, // ER_NET_WRITE_INTERRUPTED
	1203: true, // ER_TOO_MANY_USER_CONNECTIONS
	1205: true, // ER_LOCK_WAIT_TIMEOUT
	1213: true, // ER_LOCK_DEADLOCK
	1290: true, // ER_OPTION_PREVENTS_STATEMENT: --read-only
	1317: true, // ER_QUERY_INTERRUPTED
	1637: true, // ER_TOO_MANY_CONCURRENT_TRXS
	1836: true, // ER_READ_ONLY_MODE
	1927: true, // ER_CONNECTION_KILLED (MariaDB)
	1969: true, // ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
	3024: true, // ER_QUERY_TIMEOUT (MySQL max_execution_time)
	4031: true, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL: disconnected idle client)
}

// IsTransient reports whether err says that the MySQL or MariaDB server is
// away for now or that the transaction lost a race that running it again
// resolves. It reads the server error number of a *mysql.MySQLError:
// deadlock (1213), lock wait timeout (1205), a record changed since read
// under snapshot isolation (1020), too many connections (1040, 1203),
// server shutdown (1053), connection killed (1927), read-only server
// (1290, 1836), disk or table full (1021, 1114), statement timeouts (1969,
// 3024) and the others of transientErrors; and, without a server error,
// go-sql-driver's ErrInvalidConn and every error of
// dialectkit.IsConnectionError. A context cancelled by the caller is not
// transient. Other server errors (duplicate key, syntax, constraint
// violations...) are not.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var myErr *gomysql.MySQLError
	if errors.As(err, &myErr) {
		return transientErrors[myErr.Number]
	}
	return errors.Is(err, gomysql.ErrInvalidConn) || dialectkit.IsConnectionError(err)
}
