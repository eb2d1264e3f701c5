package binlog

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
)

// initialPage is the number of waiting rows read at a time at the first
// start.
const initialPage = 1000

// initial runs at a relay's first start on an outbox (no stored position),
// and when the rows at the stored position cannot be named
// (Relay.resnapshot): it opens a consistent snapshot, takes the binlog position of that
// snapshot, and hands the rows waiting in the outbox then (exactly those
// the binlog after the position will not send) to the pipeline, in seq
// order, before the stream. The position is stored once they are all
// published and deleted: a crash before that starts over with a new
// snapshot, which holds the rows not yet deleted.
func (s *session) initial(ctx context.Context) (string, error) {
	r := s.r
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return "", fmt.Errorf("idem: binlog: connect: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		return "", fmt.Errorf("idem: binlog: snapshot: %w", err)
	}
	if _, err := conn.ExecContext(ctx, `START TRANSACTION WITH CONSISTENT SNAPSHOT`); err != nil {
		return "", fmt.Errorf("idem: binlog: snapshot: %w", err)
	}
	defer func() { _, _ = conn.ExecContext(context.Background(), `ROLLBACK`) }()
	// MariaDB gives the binlog position of the snapshot exactly.
	var file string
	var pos int64
	rows, err := conn.QueryContext(ctx, `SHOW STATUS WHERE Variable_name IN ('binlog_snapshot_file', 'binlog_snapshot_position')`)
	if err != nil {
		return "", fmt.Errorf("idem: binlog: snapshot position: %w", err)
	}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			rows.Close()
			return "", fmt.Errorf("idem: binlog: snapshot position: %w", err)
		}
		if strings.EqualFold(name, "binlog_snapshot_file") {
			file = value
		} else {
			_, _ = fmt.Sscan(value, &pos)
		}
	}
	rows.Close()
	if file == "" {
		return "", fmt.Errorf("idem: binlog: the server gave no binlog_snapshot_file: is log_bin on?")
	}
	start, err := gtidAt(ctx, conn, file, pos)
	if err != nil {
		return "", err
	}
	s.file = file
	n := 0
	if r.idemTable && r.cfg.Delete == DeletePublished {
		if n, err = s.initialRows(ctx, conn); err != nil {
			return "", err
		}
	}
	// The position of the snapshot, stored once what comes before it (the
	// rows above) is published.
	s.pipe.add([]*entry{{pos: start, file: file, filePos: uint64(pos), store: true}})
	what := "first start on this outbox: reading the binlog from the server's current position"
	if r.resnapshot {
		what = "publishing the rows waiting in the outbox from a snapshot of the table; reading the binlog from the snapshot's position"
	}
	r.log.Info(what, "gtid_position", start, "binlog_file", file, "binlog_pos", pos, "waiting_rows", n)
	return start, nil
}

// initialRows hands the rows waiting in the snapshot to the pipeline, a
// page at a time as the window allows.
func (s *session) initialRows(ctx context.Context, conn *sql.Conn) (int, error) {
	r := s.r
	// Counted first, in the snapshot, for the progress lines (without
	// QueryTimeout: a cancelled statement would end the connection, and
	// the snapshot with it).
	var total int64
	if err := conn.QueryRowContext(ctx, countOf(r.sql.snapshot)).Scan(&total); err != nil && ctx.Err() == nil {
		r.log.Warn("counting the rows waiting in the outbox failed; publishing them without a total", "error", err)
	}
	s.pipe.startInitial(total)
	if total > 0 {
		what := "first start on this outbox: publishing the rows waiting in it, before the binlog"
		if r.resnapshot {
			what = "publishing the rows waiting in the outbox from a snapshot of the table, before the binlog"
		}
		r.log.Info(what, "rows", total)
	}
	rows, err := conn.QueryContext(ctx, r.sql.snapshot)
	if err != nil {
		return 0, fmt.Errorf("idem: binlog: read the waiting rows: %w", err)
	}
	defer rows.Close()
	n := 0
	var page []*entry
	for rows.Next() {
		var rec driver.OutboxRecord
		if err := outboxcodec.ScanRow(rows, &rec, nil); err != nil {
			return n, fmt.Errorf("idem: binlog: read the waiting rows: %w", err)
		}
		n++
		msg, err := outboxcodec.Message(rec)
		if err != nil {
			r.stats.unreadable.Add(1)
			if err := r.quarantine(ctx, rec, err); err != nil {
				return n, err
			}
			s.pipe.initialSettled(true)
			continue
		}
		page = append(page, &entry{msg: msg, hasMsg: true, key: rec.AggregateType + "\x00" + rec.AggregateID, rec: &rec, id: rec.RawID, initial: true})
		if len(page) == initialPage {
			if err := s.addWaiting(ctx, page); err != nil {
				return n, err
			}
			page = nil
		}
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("idem: binlog: read the waiting rows: %w", err)
	}
	if len(page) > 0 {
		if err := s.addWaiting(ctx, page); err != nil {
			return n, err
		}
	}
	s.pipe.initialRead(int64(n))
	return n, nil
}

// countOf turns the statement reading the waiting rows into the one
// counting them.
func countOf(sel string) string {
	from := sel[strings.Index(sel, "\nFROM "):]
	return "SELECT COUNT(*)" + strings.TrimSuffix(from, " ORDER BY seq")
}

// addWaiting adds committed rows to the pipeline once its window has room.
func (s *session) addWaiting(ctx context.Context, es []*entry) error {
	for s.pipe.full() {
		select {
		case <-s.pipe.progress:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.r.base.Stopping():
			return fmt.Errorf("idem: binlog: stopped while publishing the rows waiting at the first start; the next start publishes the rest")
		}
	}
	s.pipe.add(es)
	return nil
}

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
