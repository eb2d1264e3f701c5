package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/mysqlrepl"
)

// What the relay does differently on MySQL 8 (a server whose version does
// not say MariaDB): its settings, its GTID sets as positions, its
// snapshot's position.

// position is the GTID position the relay has read to: MariaDB's (the last
// GTID of each domain) or MySQL's (a GTID set).
type position struct {
	mysql bool
	maria mysqlrepl.Position
	set   mysqlrepl.GTIDSet
}

// parsePosition parses a stored position of the server's kind.
func parsePosition(mysql bool, s string) (position, error) {
	p := position{mysql: mysql}
	var err error
	if mysql {
		p.set, err = mysqlrepl.ParseGTIDSet(s)
	} else {
		p.maria, err = mysqlrepl.ParsePosition(s)
	}
	return p, err
}

// String returns the position as the server writes it.
func (p position) String() string {
	if p.mysql {
		return p.set.String()
	}
	return p.maria.String()
}

// mysqlSettings are the MySQL settings Start checks.
type mysqlSettings struct {
	version, format, rowImage, rowMetadata, gtidMode, gtidConsistency, valueOptions string
	logBin                                                                          bool
	serverID                                                                        uint32
	expireSeconds                                                                   int64
	host                                                                            managedServer // managed.go
}

// mysqlSettingsQuery reads mysqlSettings (after the version).
const mysqlSettingsQuery = `SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, @@server_id,
    @@gtid_mode, @@enforce_gtid_consistency, @@binlog_row_value_options, @@binlog_expire_logs_seconds`

// expireWarning is the binlog retention below which Start warns.
const expireWarning = 24 * time.Hour

// checkMySQLSettings checks MySQL's binlog settings: each failure names
// the setting and how to set it. Of MySQL 8's defaults, gtid_mode and
// enforce_gtid_consistency (OFF) must change: the relay's position is a
// GTID set. log_bin (ON), binlog_format (ROW), binlog_row_image (FULL),
// binlog_row_metadata (MINIMAL: the names come from information_schema)
// and binlog_row_value_options (empty) do. On a managed server (s.host)
// each names the service's own setting. The warnings say what works but
// may hurt.
func checkMySQLSettings(s mysqlSettings, serverID uint32) (warnings []string, err error) {
	var problems []string
	if major, _, _ := strings.Cut(s.version, "."); !(atoi(major) >= 8) {
		return nil, fmt.Errorf("%w: the server is MySQL %s: the binlog relay reads MySQL 8.0 or later (or MariaDB 10.5 or later); publish this outbox with the polling relay (idem relay)", ErrServerSettings, s.version)
	}
	if !s.logBin {
		hint := "remove that option so that MySQL 8 writes its binary log, and restart the server"
		if s.host != selfHosted {
			hint = s.host.logBinHint()
		}
		problems = append(problems, "the binary log is off (log_bin, or --skip-log-bin / --disable-log-bin at start-up): "+hint)
	}
	if !strings.EqualFold(s.gtidMode, "ON") {
		how := "on a running server step it up: SET GLOBAL enforce_gtid_consistency = ON; SET GLOBAL gtid_mode = OFF_PERMISSIVE; SET GLOBAL gtid_mode = ON_PERMISSIVE; (wait for ONGOING_ANONYMOUS_TRANSACTION_COUNT to be 0) SET GLOBAL gtid_mode = ON; and put gtid_mode = ON and enforce_gtid_consistency = ON in the [mysqld] section of the server's configuration"
		if s.host != selfHosted {
			how = s.host.set("enforce_gtid_consistency", "ON", false) + ", then " + s.host.set("gtid_mode", "ON", false)
		}
		problems = append(problems, fmt.Sprintf("gtid_mode is %s: the relay's position is a GTID set, which needs gtid_mode = ON (and enforce_gtid_consistency = ON first): %s", s.gtidMode, how))
	} else if !strings.EqualFold(s.gtidConsistency, "ON") {
		problems = append(problems, fmt.Sprintf("enforce_gtid_consistency is %s: %s", s.gtidConsistency, s.host.set("enforce_gtid_consistency", "ON", true)))
	}
	if !strings.EqualFold(s.format, "ROW") {
		problems = append(problems, fmt.Sprintf("binlog_format is %s: the relay reads rows, and with %s an insert may be logged as a statement, which holds no row to read: %s (sessions opened before keep their format: reconnect the writers)", s.format, s.format, s.host.set("binlog_format", "ROW", true)))
	}
	if !strings.EqualFold(s.rowImage, "FULL") {
		problems = append(problems, fmt.Sprintf("binlog_row_image is %s: with less than FULL (the default) an insert may leave out the columns that took their default, and an update the columns it did not change: %s", s.rowImage, s.host.set("binlog_row_image", "FULL", true)))
	}
	if strings.Contains(strings.ToUpper(s.valueOptions), "PARTIAL_JSON") {
		how := "SET GLOBAL binlog_row_value_options = '' and binlog_row_value_options = '' in the [mysqld] section of the server's configuration"
		if s.host != selfHosted {
			how = s.host.set("binlog_row_value_options", `"" (empty)`, true)
		}
		problems = append(problems, "binlog_row_value_options is PARTIAL_JSON: an update of a JSON column is logged as a difference, not the row: "+how)
	}
	if s.serverID == serverID {
		problems = append(problems, fmt.Sprintf("the server's server_id is %d, the relay's too: set Config.ServerID (--server-id) to a number no server or replica of the topology uses", serverID))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrServerSettings, strings.Join(problems, "; "))
	}
	if keep := time.Duration(s.expireSeconds) * time.Second; s.expireSeconds > 0 && keep < expireWarning {
		warnings = append(warnings, fmt.Sprintf("binlog_expire_logs_seconds is %d (%v): MySQL purges binlog files after that whether the relay read them or not, and a relay stopped for longer loses its position (idem cdc reset-position then); keep the binlog for longer than the relay may be down (the default is 30 days)", s.expireSeconds, keep))
	}
	return warnings, nil
}

// setupMySQL reads and checks MySQL's settings, on the service host; it
// returns binlog_row_metadata.
func (r *source) setupMySQL(ctx context.Context, version string, host managedServer) (string, error) {
	s := mysqlSettings{version: version, host: host}
	err := r.db.QueryRowContext(ctx, mysqlSettingsQuery).Scan(&s.logBin, &s.format, &s.rowImage, &s.rowMetadata, &s.serverID,
		&s.gtidMode, &s.gtidConsistency, &s.valueOptions, &s.expireSeconds)
	if err != nil {
		return "", fmt.Errorf("idem: binlog: read the server's binlog settings (MySQL 8.0 or later has them all): %w", err)
	}
	warnings, err := checkMySQLSettings(s, r.cfg.ServerID)
	if err != nil {
		return "", err
	}
	for _, w := range warnings {
		r.log.Warn(w)
	}
	return s.rowMetadata, nil
}

// checkGTIDSet checks, before a dump, that a stored MySQL position can be
// served: every purged transaction is in it (else the binlog it needs is
// gone: ErrPositionPurged), and it holds no transaction the server never
// had (a position of another server, or of a server restored from an
// older backup).
func (r *source) checkGTIDSet(ctx context.Context, pos string) error {
	var purged, executed string
	var coveredPurged, known bool
	err := r.db.QueryRowContext(ctx, `SELECT @@global.gtid_purged, @@global.gtid_executed,
    GTID_SUBSET(@@global.gtid_purged, ?), GTID_SUBSET(?, @@global.gtid_executed)`, pos, pos).Scan(&purged, &executed, &coveredPurged, &known)
	if err != nil {
		return fmt.Errorf("idem: binlog: compare the stored position with the server's GTIDs: %w", err)
	}
	if !coveredPurged {
		return fmt.Errorf("%w: %s: the server purged transactions this position has not read (gtid_purged is %s): the binlog files that hold them are gone (binlog_expire_logs_seconds, PURGE BINARY LOGS). The rows still waiting in the outbox can be published: \"idem cdc reset-position\" forgets the position, and the next start publishes them, then reads from the server's current position; events whose rows are gone are lost",
			ErrPositionPurged, pos, oneLine(purged))
	}
	if !known {
		return fmt.Errorf("%w: the stored position %s holds transactions this server never had (its gtid_executed is %s): it was stored by a relay reading another server, or this server was restored from an older backup; check the URL, or forget the position (\"idem cdc reset-position\") to start from this server's current position",
			ErrPositionPurged, pos, oneLine(executed))
	}
	return nil
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// oneLine removes the newlines MySQL puts after each comma of a GTID set.
func oneLine(set string) string { return strings.ReplaceAll(set, "\n", "") }

// binaryLogStatus returns the server's current binlog file, position and
// GTID set: SHOW BINARY LOG STATUS (MySQL 8.2+; 8.4 has no SHOW MASTER
// STATUS), else SHOW MASTER STATUS.
func binaryLogStatus(ctx context.Context, conn *sql.Conn) (file string, pos int64, gtids string, err error) {
	rows, err := conn.QueryContext(ctx, `SHOW BINARY LOG STATUS`)
	var me *gomysql.MySQLError
	if errors.As(err, &me) && me.Number == 1064 { // a syntax error before 8.2
		rows, err = conn.QueryContext(ctx, `SHOW MASTER STATUS`)
	}
	if err != nil {
		return "", 0, "", fmt.Errorf("idem: binlog: SHOW BINARY LOG STATUS: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return "", 0, "", err
	}
	if !rows.Next() {
		return "", 0, "", fmt.Errorf("idem: binlog: SHOW BINARY LOG STATUS gave nothing: is log_bin on?")
	}
	vals := make([]sql.NullString, len(cols))
	dest := make([]any, len(cols))
	for i := range vals {
		dest[i] = &vals[i]
	}
	if err := rows.Scan(dest...); err != nil {
		return "", 0, "", err
	}
	for i, c := range cols {
		switch strings.ToLower(c) {
		case "file":
			file = vals[i].String
		case "position":
			pos, _ = strconv.ParseInt(vals[i].String, 10, 64)
		case "executed_gtid_set":
			gtids = oneLine(vals[i].String)
		}
	}
	return file, pos, gtids, rows.Err()
}

// snapshotMySQL opens the snapshot of the first start on MySQL, on conn
// (REPEATABLE READ), and returns the GTID set it is consistent with: the
// binlog after it holds every transaction the snapshot does not.
//
// MySQL gives no binlog position of a snapshot (MariaDB's
// binlog_snapshot_file), and neither of its exact ways takes none of a
// writer's time or a privilege more: FLUSH TABLES WITH READ LOCK blocks
// every writer (and needs RELOAD), performance_schema.log_status blocks
// commits while it reads (and needs BACKUP_ADMIN), and neither is atomic
// with the start of the snapshot without the first. So the GTID set is
// read before the snapshot starts: MySQL adds a transaction to
// gtid_executed after the storage engine commits it (the commit stage of
// its group commit), so every transaction of the set is in the snapshot,
// and the binlog after the set holds every transaction the snapshot lacks.
// A transaction that commits between the two is in both: its rows are
// published from the snapshot, then again from the binlog (at least once,
// as after a crash: consumers deduplicate). None is lost.
func snapshotMySQL(ctx context.Context, conn *sql.Conn) (start, file string, pos int64, err error) {
	file, pos, start, err = binaryLogStatus(ctx, conn)
	if err != nil {
		return "", "", 0, err
	}
	if _, err := conn.ExecContext(ctx, `START TRANSACTION WITH CONSISTENT SNAPSHOT`); err != nil {
		return "", "", 0, fmt.Errorf("idem: binlog: snapshot: %w", err)
	}
	return start, file, pos, nil
}
