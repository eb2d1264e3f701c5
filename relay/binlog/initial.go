package binlog

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/relay/internal/logengine"
	"github.com/idem-go/idem/relay/logrelay"
)

// openSnapshot runs at a relay's first start on an outbox (no stored
// position), and when the rows at the stored position cannot be named
// (source.resnapshot): it opens a consistent snapshot, takes the binlog
// position of that snapshot and the highest seq of the rows waiting in it,
// and ends it. The rows waiting in the outbox then (exactly those the
// binlog after the position will not send; on MySQL, those and maybe a few
// it will: see snapshotMySQL) all have a seq at most that one: they are
// the session's initial rows, read a page at a time outside any
// transaction and published in seq order before the binlog. The snapshot
// lasts a few statements: a transaction held while the rows are published
// would hold the outbox's metadata lock, and an ALTER TABLE waiting for it
// would stop every writer of the outbox, the relay's deletes included,
// until the publishing ends. The position is stored once the rows are all
// published and deleted (Start): a crash before that starts over with a
// new snapshot, which holds the rows not yet deleted. It returns the
// position.
func (s *session) openSnapshot(ctx context.Context) (string, error) {
	r := s.r
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return "", fmt.Errorf("idem: binlog: connect: %w", err)
	}
	defer func() {
		_, _ = conn.ExecContext(context.Background(), `ROLLBACK`)
		_ = conn.Close()
	}()
	if _, err := conn.ExecContext(ctx, `SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		return "", fmt.Errorf("idem: binlog: snapshot: %w", err)
	}
	var start, file string
	var pos int64
	if r.mysql {
		start, file, pos, err = snapshotMySQL(ctx, conn)
	} else {
		start, file, pos, err = snapshotMariaDB(ctx, conn)
	}
	if err != nil {
		return "", err
	}
	initial := r.idemTable && r.cfg.Delete == logrelay.DeletePublished
	// The highest seq waiting in the snapshot, read in it: a row with a
	// higher seq was not committed then, and the binlog sends it.
	var last sql.NullInt64
	if initial {
		if err := conn.QueryRowContext(ctx, `SELECT MAX(seq) FROM `+r.sql.table+` WHERE `+r.sql.waiting).Scan(&last); err != nil {
			return "", fmt.Errorf("idem: binlog: read the rows waiting in the outbox: %w", err)
		}
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		return "", fmt.Errorf("idem: binlog: snapshot: %w", err)
	}
	s.file = file
	s.snapshot = &binlogPos{gtid: start, file: file, filePos: uint64(pos)}
	if initial {
		s.initial = &initialRows{s: r, last: last.Int64, resnapshot: r.resnapshot}
	}
	what := "first start on this outbox: reading the binlog from the snapshot's position, after the rows waiting in the outbox"
	if r.resnapshot {
		what = "publishing the rows waiting in the outbox from a snapshot of the table; reading the binlog from the snapshot's position"
	}
	r.log.Info(what, "gtid_position", start, "binlog_file", file, "binlog_pos", pos)
	return start, nil
}

// snapshotMariaDB opens the snapshot of the first start on MariaDB, on
// conn, and returns its GTID position and binlog file and position, which
// MariaDB gives exactly.
func snapshotMariaDB(ctx context.Context, conn *sql.Conn) (start, file string, pos int64, err error) {
	if _, err := conn.ExecContext(ctx, `START TRANSACTION WITH CONSISTENT SNAPSHOT`); err != nil {
		return "", "", 0, fmt.Errorf("idem: binlog: snapshot: %w", err)
	}
	rows, err := conn.QueryContext(ctx, `SHOW STATUS WHERE Variable_name IN ('binlog_snapshot_file', 'binlog_snapshot_position')`)
	if err != nil {
		return "", "", 0, fmt.Errorf("idem: binlog: snapshot position: %w", err)
	}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			rows.Close()
			return "", "", 0, fmt.Errorf("idem: binlog: snapshot position: %w", err)
		}
		if strings.EqualFold(name, "binlog_snapshot_file") {
			file = value
		} else {
			_, _ = fmt.Sscan(value, &pos)
		}
	}
	rows.Close()
	if file == "" {
		return "", "", 0, fmt.Errorf("idem: binlog: the server gave no binlog_snapshot_file: is log_bin on?")
	}
	start, err = gtidAt(ctx, conn, file, pos)
	return start, file, pos, err
}

// initialRows are the rows waiting in the outbox in the snapshot of a
// first start: those waiting now with a seq at most the snapshot's
// highest. The few of them committed after the snapshot (their
// transaction was open then, with a seq below the highest) are published
// again from the binlog, as any row may be published twice.
type initialRows struct {
	s          *source
	last       int64 // the highest seq waiting in the snapshot
	after      int64 // the last seq read
	resnapshot bool
}

// Count counts the rows.
func (in *initialRows) Count(ctx context.Context) (int64, error) {
	qctx, cancel := context.WithTimeout(ctx, in.s.cfg.QueryTimeout)
	defer cancel()
	var total int64
	err := in.s.db.QueryRowContext(qctx, `SELECT COUNT(*) FROM `+in.s.sql.table+` WHERE `+in.s.sql.waiting+` AND seq <= ?`, in.last).Scan(&total)
	return total, err
}

// Page reads the next page of the rows, in seq order.
func (in *initialRows) Page(ctx context.Context) ([]driver.OutboxRecord, error) {
	qctx, cancel := context.WithTimeout(ctx, in.s.cfg.QueryTimeout)
	defer cancel()
	rows, err := in.s.db.QueryContext(qctx, `SELECT `+rowColumns+`
FROM `+in.s.sql.table+` WHERE `+in.s.sql.waiting+` AND seq > ? AND seq <= ? ORDER BY seq LIMIT `+fmt.Sprint(logengine.DuePage), in.after, in.last)
	if err != nil {
		return nil, fmt.Errorf("idem: binlog: read the waiting rows: %w", err)
	}
	recs, err := scanRecords(rows)
	if err != nil {
		return nil, fmt.Errorf("idem: binlog: read the waiting rows: %w", err)
	}
	if len(recs) > 0 {
		in.after = recs[len(recs)-1].Seq
	}
	return recs, nil
}

// When says when the rows waited.
func (in *initialRows) When() string {
	if in.resnapshot {
		return "in a snapshot of the table"
	}
	return "at the first start"
}

// Lost returns "": the position is stored after the rows only, and the
// next start publishes those left from a new snapshot.
func (in *initialRows) Lost() string { return "" }

// Close does nothing: no transaction is held while the rows are read.
func (in *initialRows) Close() {}

// gtidAt returns the GTID position at file:pos, an event's boundary.
// BINLOG_GTID_POS gives it, except at the very end of the binlog (NULL):
// there it is @@gtid_binlog_pos, read while the binlog does not move.
func gtidAt(ctx context.Context, conn *sql.Conn, file string, pos int64) (string, error) {
	for range 100 {
		var gtid sql.NullString
		if err := conn.QueryRowContext(ctx, `SELECT BINLOG_GTID_POS(?, ?)`, file, pos).Scan(&gtid); err != nil {
			return "", fmt.Errorf("idem: binlog: snapshot position: %w", err)
		}
		if gtid.Valid {
			return gtid.String, nil
		}
		f1, p1, err := masterStatus(ctx, conn)
		if err != nil {
			return "", err
		}
		var current string
		if err := conn.QueryRowContext(ctx, `SELECT @@gtid_binlog_pos`).Scan(&current); err != nil {
			return "", fmt.Errorf("idem: binlog: snapshot position: %w", err)
		}
		f2, p2, err := masterStatus(ctx, conn)
		if err != nil {
			return "", err
		}
		if f1 == file && p1 == pos && f2 == file && p2 == pos {
			return current, nil
		}
		// The binlog moved meanwhile: file:pos is no longer its end.
	}
	return "", fmt.Errorf("idem: binlog: BINLOG_GTID_POS(%q, %d) stays NULL", file, pos)
}

// masterStatus returns the server's current binlog file and position.
func masterStatus(ctx context.Context, conn *sql.Conn) (string, int64, error) {
	rows, err := conn.QueryContext(ctx, `SHOW MASTER STATUS`)
	if err != nil {
		return "", 0, fmt.Errorf("idem: binlog: SHOW MASTER STATUS: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return "", 0, err
	}
	if !rows.Next() {
		return "", 0, fmt.Errorf("idem: binlog: SHOW MASTER STATUS gave nothing: is log_bin on?")
	}
	var file string
	var pos int64
	dest := []any{&file, &pos}
	for len(dest) < len(cols) {
		dest = append(dest, new(any))
	}
	if err := rows.Scan(dest...); err != nil {
		return "", 0, err
	}
	return file, pos, rows.Err()
}
