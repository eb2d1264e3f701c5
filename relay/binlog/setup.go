package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/relay/internal/logengine"
	"github.com/idem-go/idem/relay/logrelay"
)

// queries are the relay's statements on its outbox.
type queries struct {
	table, position string
	archive         string // the outbox's archive (migration 0013)
	quarantine      string
	park            string
	parkTyped       string
	loadPosition    string
	storePosition   string
	lockName        string
	// waiting is the condition of the rows waiting at the first start.
	waiting string
	// due reads the delayed rows due at ?; set on a table with
	// not_before. markRows marks published (KeepRows) the rows of the ids
	// %s.
	due, markRows string
}

// rowColumns are the outbox's columns the relay reads from the table.
const rowColumns = `id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers, seq,
    created_at, attempts, content_type, payload_binary`

func newQueries(schema, outbox, position, archive string) queries {
	t := mysql.QuoteIdent(schema) + "." + mysql.QuoteIdent(outbox)
	p := mysql.QuoteIdent(schema) + "." + mysql.QuoteIdent(position)
	lock := "idem_binlog_" + schema + "." + outbox
	if len(lock) > 64 { // the server's limit on lock names
		lock = lock[:64]
	}
	return queries{
		table: t, position: p, lockName: lock,
		archive: mysql.QuoteIdent(schema) + "." + mysql.QuoteIdent(archive),
		quarantine: `UPDATE ` + t + ` SET quarantined_at = UTC_TIMESTAMP(6), last_error = ?, attempts = ?
WHERE id = ? AND published_at IS NULL`,
		park: `INSERT INTO ` + t + ` (id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers,
    quarantined_at, last_error, attempts)
VALUES (?, ?, ?, ?, ?, ?, ?, COALESCE(?, '{}'), UTC_TIMESTAMP(6), ?, ?)`,
		// park for an event with a content type: its payload in
		// payload_binary when it is not JSON.
		parkTyped: `INSERT INTO ` + t + ` (id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers,
    quarantined_at, last_error, attempts, content_type, payload_binary)
VALUES (?, ?, ?, ?, ?, ?, ?, COALESCE(?, '{}'), UTC_TIMESTAMP(6), ?, ?, ?, ?)`,
		loadPosition: `SELECT gtid_pos FROM ` + p + ` WHERE outbox_table = ?`,
		storePosition: `INSERT INTO ` + p + ` (outbox_table, gtid_pos, binlog_file, binlog_pos, updated_at)
VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE gtid_pos = VALUES(gtid_pos), binlog_file = VALUES(binlog_file),
    binlog_pos = VALUES(binlog_pos), updated_at = VALUES(updated_at)`,
		waiting:  `published_at IS NULL AND quarantined_at IS NULL`,
		markRows: `UPDATE ` + t + ` SET published_at = UTC_TIMESTAMP(6) WHERE published_at IS NULL AND id IN (%s)`,
	}
}

// serverSettings are the settings Start checks.
type serverSettings struct {
	version, format, rowImage, rowMetadata string
	logBin, compress                       bool
	serverID                               uint32
	host                                   managedServer // managed.go
}

// ErrServerSettings is wrapped by the errors of Start that name a server
// setting the relay needs and how to set it.
var ErrServerSettings = errors.New("idem: binlog: server settings")

// checkSettings checks MariaDB's binlog settings (MySQL's:
// checkMySQLSettings): each failure names the setting and how to set it.
// Of MariaDB's defaults, log_bin (off) and binlog_format (MIXED) must
// change; binlog_row_image (FULL), binlog_row_metadata (NO_LOG: the column
// names are read from information_schema, columns.go), log_bin_compress
// (off) and server_id (1) do.
func checkSettings(s serverSettings, serverID uint32) error {
	var problems []string
	if !s.logBin {
		problems = append(problems, "the binary log is off (log_bin): "+s.host.logBinHint())
	}
	if !strings.EqualFold(s.format, "ROW") {
		// Under MIXED, MariaDB logs a statement as rows only when it deems
		// it unsafe for statements: an INSERT of plain values into a table
		// with Debezium's columns is logged as a statement, which holds no
		// rows to read (idem's own table, whose defaults call
		// UTC_TIMESTAMP, happens to be logged as rows: a rule of MariaDB's
		// that no correctness should rest on).
		logged := "every insert is logged as a statement"
		if strings.EqualFold(s.format, "MIXED") {
			logged = "an insert of plain values is logged as a statement"
		}
		problems = append(problems, fmt.Sprintf("binlog_format is %s: the relay reads rows, and with %s %s, which the relay cannot read (its event would not be published): %s (sessions opened before keep their format: reconnect the writers)", s.format, s.format, logged, s.host.set("binlog_format", "ROW", true)))
	}
	if !strings.EqualFold(s.rowImage, "FULL") {
		problems = append(problems, fmt.Sprintf("binlog_row_image is %s: with less than FULL (the default) an insert may leave out the columns that took their default, and an update the columns it did not change: %s", s.rowImage, s.host.set("binlog_row_image", "FULL", true)))
	}
	if s.compress {
		problems = append(problems, "log_bin_compress is ON: the relay does not read compressed events: "+s.host.set("log_bin_compress", "OFF", true))
	}
	if s.serverID == serverID {
		problems = append(problems, fmt.Sprintf("the server's server_id is %d, the relay's too: set Config.ServerID (--server-id) to a number no server or replica of the topology uses", serverID))
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrServerSettings, strings.Join(problems, "; "))
}

// ErrPrivileges is wrapped by the error of Start when the relay's user
// lacks a privilege of replication.
var ErrPrivileges = errors.New("idem: binlog: privileges")

// checkPrivileges checks that the relay's user may read the binlog.
func checkPrivileges(user string, privs []string) error {
	has := map[string]bool{}
	for _, p := range privs {
		has[strings.ToUpper(p)] = true
	}
	var missing []string
	if !has["REPLICATION SLAVE"] && !has["REPLICATION REPLICA"] {
		missing = append(missing, "REPLICATION SLAVE")
	}
	if !has["REPLICATION CLIENT"] && !has["BINLOG MONITOR"] {
		missing = append(missing, "REPLICATION CLIENT")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: the user %s lacks %s, which reading the binlog needs: GRANT %s ON *.* TO %s",
		ErrPrivileges, user, strings.Join(missing, " and "), strings.Join(missing, ", "), user)
}

// grantee returns CURRENT_USER() ("name@host") as information_schema
// writes grantees ("'name'@'host'").
func grantee(current string) string {
	i := strings.LastIndexByte(current, '@')
	if i < 0 {
		return "'" + current + "'"
	}
	return "'" + current[:i] + "'@'" + current[i+1:] + "'"
}

// Setup checks the server, its settings and the tables, and takes the
// outbox's lock when it is free.
func (r *source) Setup(ctx context.Context) (logengine.Setup, error) {
	if err := r.setup(ctx); err != nil {
		return logengine.Setup{}, err
	}
	return r.set, nil
}

func (r *source) setup(ctx context.Context) error {
	if err := r.db.PingContext(ctx); err != nil {
		return fmt.Errorf("idem: binlog: connect: %w", err)
	}
	var s serverSettings
	if err := r.db.QueryRowContext(ctx, `SELECT @@version`).Scan(&s.version); err != nil {
		return fmt.Errorf("idem: binlog: read the server's version: %w", err)
	}
	s.host = readSigns(ctx, r.db).detect()
	r.mysql = !strings.Contains(strings.ToLower(s.version), "mariadb")
	if r.mysql {
		var err error
		if s.rowMetadata, err = r.setupMySQL(ctx, s.version, s.host); err != nil {
			return err
		}
	} else {
		err := r.db.QueryRowContext(ctx, `SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata,
    @@log_bin_compress, @@server_id`).Scan(&s.logBin, &s.format, &s.rowImage, &s.rowMetadata, &s.compress, &s.serverID)
		if err != nil {
			return fmt.Errorf("idem: binlog: read the server's binlog settings (MariaDB 10.5 or later has them all): %w", err)
		}
		if err := checkSettings(s, r.cfg.ServerID); err != nil {
			return err
		}
	}
	var current string
	if err := r.db.QueryRowContext(ctx, `SELECT CURRENT_USER()`).Scan(&current); err != nil {
		return fmt.Errorf("idem: binlog: read the current user: %w", err)
	}
	rows, err := r.db.QueryContext(ctx, `SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = ?`, grantee(current))
	if err != nil {
		return fmt.Errorf("idem: binlog: read the user's privileges: %w", err)
	}
	privs, err := scanStrings(rows)
	if err != nil {
		return fmt.Errorf("idem: binlog: read the user's privileges: %w", err)
	}
	if err := checkPrivileges(grantee(current), privs); err != nil {
		return fmt.Errorf("%w%s", err, s.host.grantHint())
	}
	r.sql = newQueries(r.schema, r.cfg.Tables.Outbox, r.cfg.Tables.BinlogPosition, r.cfg.Tables.OutboxArchive)
	if err := r.checkTables(ctx); err != nil {
		return err
	}
	if strings.EqualFold(s.rowMetadata, "FULL") {
		r.namesFrom(namesFromBinlog, s.rowMetadata)
	} else {
		r.namesFrom(namesFromSchema, s.rowMetadata)
	}
	// When no other process reads this outbox, check that the binlog still
	// holds the stored position, and keep the lock for run.
	lock, err := r.acquire(ctx)
	if err != nil || lock == nil {
		return err
	}
	pos, err := r.loadPosition(ctx)
	switch {
	case err == nil && pos != "":
		err = r.probe(ctx, pos)
	case err == nil && !(r.idemTable && r.cfg.Delete == logrelay.DeletePublished):
		// The first start on an outbox whose waiting rows the relay cannot
		// publish: what is written once Start returns must be in the
		// binlog it reads, so the position is taken now.
		err = r.storeCurrentPosition(ctx)
	}
	if err != nil {
		r.release(lock)
		return err
	}
	r.lock = lock
	return nil
}

// probe starts a dump from pos and reads until the server has accepted
// it (its first GTID list, or the first transaction).
func (r *source) probe(ctx context.Context, pos string) error {
	if r.mysql {
		if err := r.checkGTIDSet(ctx, pos); err != nil {
			return err
		}
	}
	conn, err := mysqlrepl.Dial(ctx, r.repl)
	if err != nil {
		return fmt.Errorf("idem: binlog: replication connection: %w", err)
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	} else {
		_ = conn.SetDeadline(time.Now().Add(r.cfg.QueryTimeout))
	}
	if err := conn.StartDump(ctx, pos); err != nil {
		return r.dumpError(err, pos)
	}
	for {
		ev, err := conn.ReadEvent()
		if err != nil {
			return r.dumpError(err, pos)
		}
		switch ev.(type) {
		case *mysqlrepl.GTIDListEvent, *mysqlrepl.GTIDEvent, *mysqlrepl.HeartbeatEvent,
			*mysqlrepl.PreviousGTIDsEvent, *mysqlrepl.MySQLGTIDEvent:
			return nil
		}
	}
}

// checkTables checks the outbox's columns and the position table.
func (r *source) checkTables(ctx context.Context) error {
	cols, err := r.readColumns(ctx)
	if err != nil {
		return err
	}
	if len(cols) == 0 {
		return fmt.Errorf("idem: binlog: no outbox table %s: run \"idem migrate\" (or create a table with Debezium's columns id, aggregatetype, aggregateid, type, payload)", r.sql.table)
	}
	has := map[string]bool{}
	for _, c := range cols {
		has[strings.ToLower(c.name)] = true
	}
	for _, c := range []string{"id", "aggregatetype", "aggregateid", "type", "payload"} {
		if !has[c] {
			return fmt.Errorf("idem: binlog: the outbox %s has no column %s: the relay reads Debezium's outbox columns id, aggregatetype, aggregateid, type and payload", r.sql.table, c)
		}
	}
	r.idemTable = has["seq"] && has["published_at"] && has["quarantined_at"] && has["last_error"] && has["attempts"]
	r.delayTable = r.idemTable && has["not_before"]
	r.set.Delayed = r.delayTable
	if r.delayTable {
		// Delayed rows wait in the table for their time (the engine
		// publishes them once due), also at the first start.
		// scheduled_idx (published_at, not_before) holds them.
		r.sql.waiting += " AND not_before IS NULL"
		r.sql.due = `SELECT ` + rowColumns + `
FROM ` + r.sql.table + ` WHERE published_at IS NULL AND not_before IS NOT NULL AND not_before <= ? AND quarantined_at IS NULL
ORDER BY seq LIMIT ` + fmt.Sprint(logengine.DuePage)
	}
	var n int
	err = r.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?`,
		r.schema, r.cfg.Tables.BinlogPosition).Scan(&n)
	if err != nil {
		return fmt.Errorf("idem: binlog: look for the position table: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("idem: binlog: no table %s for the relay's position: run \"idem migrate\" on this database (it creates it)", r.sql.position)
	}
	drv, err := mysql.NewTables(r.db, idem.Tables{Schema: r.schema, Outbox: r.cfg.Tables.Outbox,
		OutboxArchive: r.cfg.Tables.OutboxArchive, ConsumerPause: r.cfg.Tables.ConsumerPause})
	if err != nil {
		return fmt.Errorf("idem: binlog: %w", err)
	}
	r.set.Outbox, r.drv = r.cfg.Tables.Outbox, drv
	err = r.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?`,
		r.schema, r.cfg.Tables.ConsumerPause).Scan(&n)
	if err != nil {
		return fmt.Errorf("idem: binlog: look for the table of operators' pauses: %w", err)
	}
	if n > 0 {
		if _, err := drv.Dialect().ListPauses(ctx, drv.Pool(), idem.PauseRelay, r.cfg.Tables.Outbox); err != nil {
			// A user without SELECT on the table: the relay runs, and
			// cannot be paused.
			r.log.Warn("cannot read the table of operators' pauses: this relay cannot be paused (idem pause --relay) until its user may: GRANT SELECT ON "+
				mysql.QuoteIdent(r.schema)+"."+mysql.QuoteIdent(r.cfg.Tables.ConsumerPause)+" TO the relay's user", "error", err)
		} else {
			r.set.Pauses, r.set.PauseEx, r.set.PauseName = drv.Dialect(), drv.Pool(), r.cfg.Tables.Outbox
		}
	}
	if r.cfg.ArchiveRetention <= 0 {
		return nil
	}
	err = r.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?`,
		r.schema, r.cfg.Tables.OutboxArchive).Scan(&n)
	if err != nil {
		return fmt.Errorf("idem: binlog: look for the outbox's archive: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %s, the archive of the events the relay publishes, for idem replay: run \"idem migrate\" (migration 0013), or turn the archive off (Config.ArchiveRetention negative, idem cdc --archive-retention 0)", idem.ErrMissingTable, r.sql.archive)
	}
	r.set.Archiver = drv.Dialect().(driver.OutboxArchiver)
	r.set.ArchiveEx = drv.Pool()
	return nil
}

func scanStrings(rows *sql.Rows) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// storeCurrentPosition stores the server's current binlog position as the
// relay's, at the first start on an outbox whose waiting rows it cannot
// tell (a table without idem's columns, or Delete = KeepRows): they are
// left to another relay, with a warning.
func (r *source) storeCurrentPosition(ctx context.Context) error {
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idem: binlog: connect: %w", err)
	}
	defer conn.Close()
	var file, gtid string
	var pos int64
	if r.mysql {
		file, pos, gtid, err = binaryLogStatus(ctx, conn)
	} else {
		file, pos, err = masterStatus(ctx, conn)
		if err == nil {
			gtid, err = gtidAt(ctx, conn, file, pos)
		}
	}
	if err != nil {
		return err
	}
	var held int
	if err := conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM `+r.sql.table+` LIMIT 1) t`).Scan(&held); err == nil && held > 0 {
		r.log.Warn("the outbox held rows at the relay's first start; they are not in the binlog it reads, and without idem's seq, published_at and quarantined_at columns (or with Delete = KeepRows) the relay cannot tell which wait: publish them another way (the polling relay, idem relay), or delete them",
			"table", r.sql.table)
	}
	if _, err := conn.ExecContext(ctx, r.sql.storePosition, r.cfg.Tables.Outbox, gtid, file, pos); err != nil {
		return fmt.Errorf("idem: binlog: store the position: %w", err)
	}
	r.log.Info("first start on this outbox: reading the binlog from the server's current position", "gtid_position", gtid, "binlog_file", file, "binlog_pos", pos)
	return nil
}
