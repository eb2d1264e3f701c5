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

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/internal/outboxcodec"
	"github.com/idem-go/idem/relay/internal/logengine"
	"github.com/idem-go/idem/relay/logrelay"
)

// ErrPositionPurged is wrapped by the error of a relay whose stored
// position is no longer in the server's binlog (purged by
// binlog_expire_logs_seconds, expire_logs_days or PURGE BINARY LOGS).
// ResetPosition ("idem cdc reset-position") forgets the position: the next
// start publishes the rows still waiting in the outbox, then reads the
// binlog from the server's current position.
var ErrPositionPurged = errors.New("idem: binlog: the stored position is no longer in the server's binlog")

// acquire tries to take the outbox's named lock on a connection of its
// own, which holds it for the relay's life: the server releases it when
// that connection ends, the relay's process with it. It returns nil and no
// error when another session holds it.
func (r *source) acquire(ctx context.Context) (*sql.Conn, error) {
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("idem: binlog: connect: %w", err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 0)`, r.sql.lockName).Scan(&got); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("idem: binlog: take the outbox's lock: %w", err)
	}
	if got.Int64 != 1 {
		_ = conn.Close()
		return nil, nil
	}
	return conn, nil
}

// holds reports whether the lock's connection still holds the lock.
func (r *source) holds(lock *sql.Conn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	var mine sql.NullBool
	err := lock.QueryRowContext(ctx, `SELECT IS_USED_LOCK(?) = CONNECTION_ID()`, r.sql.lockName).Scan(&mine)
	return err == nil && mine.Valid && mine.Bool
}

func (r *source) release(lock *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = lock.ExecContext(ctx, `DO RELEASE_LOCK(?)`, r.sql.lockName)
	_ = lock.Close()
}

// txState is the transaction being read.
type txState struct {
	rows   []logengine.Row
	lockID string
	// own is set when the transaction wrote the relay's position table.
	own bool
	// standalone: a statement logged alone (DDL), ended by its query
	// event, without XID or COMMIT.
	standalone bool
	// mysqlFirst: a MySQL transaction whose first statement is not read
	// yet (BEGIN, or a DDL logged alone).
	mysqlFirst bool
	// savepoints are the entries read when each savepoint was set.
	savepoints map[string]int
	// parts: the group may be handed on in parts (logengine.Tx.Part), as
	// nothing in it can be undone (mysqlrepl.GTIDEvent.Transactional);
	// handed: some were.
	parts, handed bool
}

// statementInsert reports whether a statement logged as such inserts into
// a table named table (any schema: a guess, for a loud error).
func statementInsert(q, table string) bool {
	u := strings.ToUpper(q)
	if !strings.HasPrefix(u, "INSERT") && !strings.HasPrefix(u, "REPLACE") {
		return false
	}
	return strings.Contains(strings.ToLower(q), strings.ToLower(table))
}

// savepoint returns the savepoint named by a statement that starts with one
// of prefixes (case aside), unquoted.
func savepoint(q string, prefixes ...string) (string, bool) {
	for _, p := range prefixes {
		if len(q) > len(p) && strings.EqualFold(q[:len(p)], p) && q[len(p)] == ' ' {
			name := strings.TrimSpace(q[len(p):])
			if strings.ContainsAny(name, " \t") {
				continue // a longer prefix ("ROLLBACK TO SAVEPOINT x" read as "ROLLBACK TO")
			}
			return strings.Trim(name, "`"), true
		}
	}
	return "", false
}

// session is one replication connection, with the outbox's lock.
type session struct {
	r    *source
	lock *sql.Conn
	vis  *sql.Conn // READ COMMITTED, for the locking reads (FirstInvisible)
	conn *mysqlrepl.Conn
	tx   *txState
	done *logengine.Tx // a transaction read, returned by Read
	pos  position      // after the last transaction read
	file string
	// initial holds the rows waiting at the first start (nil otherwise),
	// and snapshot the position of their snapshot, stored by Start.
	initial  logengine.Initial
	snapshot *binlogPos
	events   chan event
	check    *time.Ticker
	until    *time.Timer // Read's
	// heard is when the server's last event was read, moved forward by
	// the time the relay did not read (its window full).
	heard, readEnd time.Time
	// columns are the outbox's columns from information_schema, when the
	// binlog holds no names; nil until needed, and after a DDL statement
	// on the outbox.
	columns []schemaColumn
	// idx is the outbox's column index (columnIndex) for the table map
	// columns mapped; unsigned, the columns information_schema says are
	// unsigned, when the names came from there.
	idx      map[string]int
	mapped   []mysqlrepl.Column
	unsigned []bool
	// stored is the position last stored, at storedAt.
	stored   string
	storedAt time.Time
}

// binlogPos is a position in the binlog: the GTID position after a
// transaction, and where it ends in which file.
type binlogPos struct {
	gtid    string
	file    string
	filePos uint64
}

// idleStoreInterval is how often the position is stored when only
// transactions without events moved it.
const idleStoreInterval = 10 * time.Second

// event is what the reading goroutine passes on.
type event struct {
	ev  mysqlrepl.Event
	err error
}

// Lead takes the outbox's lock (logengine.ErrStandby while another
// process holds it) and returns the reader of one session: at the first
// start (no stored position), the rows waiting in the outbox in a
// consistent snapshot, then the binlog from that snapshot's position;
// otherwise the binlog from the stored position.
func (r *source) Lead(ctx context.Context) (logengine.Reader, error) {
	if r.lock == nil {
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		lock, err := r.acquire(qctx)
		cancel()
		if err != nil {
			return nil, err
		}
		if lock == nil {
			return nil, logengine.ErrStandby
		}
		r.lock = lock
	}
	s := &session{r: r, lock: r.lock}
	if err := s.open(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *session) open(ctx context.Context) error {
	r := s.r
	vis, err := r.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idem: binlog: connect: %w", err)
	}
	s.vis = vis
	if _, err := vis.ExecContext(ctx, `SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED`); err != nil {
		return fmt.Errorf("idem: binlog: connect: %w", err)
	}
	stored, err := r.loadPosition(ctx)
	if err != nil {
		return err
	}
	start := stored
	if stored == "" || r.resnapshot {
		// The snapshot's position is stored once its rows are published
		// (Start).
		if start, err = s.openSnapshot(ctx); err != nil {
			return err
		}
		r.resnapshot = false
	} else {
		p := stored
		r.eng.C.Position.Store(&p)
	}
	if s.pos, err = parsePosition(r.mysql, start); err != nil {
		return fmt.Errorf("idem: binlog: the stored position %q: %w", start, err)
	}
	s.stored = stored
	return nil
}

// Initial returns the rows waiting at the first start, if any.
func (s *session) Initial() logengine.Initial { return s.initial }

// Start stores the first start's position, once its rows are published,
// then starts reading the binlog.
func (s *session) Start(ctx context.Context) error {
	r := s.r
	s.initial = nil // published, and closed by the engine
	if p := s.snapshot; p != nil {
		if err := r.storePosition(ctx, *p); err != nil {
			return err
		}
		s.stored, s.storedAt = p.gtid, time.Now()
		s.snapshot = nil
	}
	conn, err := mysqlrepl.Dial(ctx, r.repl)
	if err != nil {
		return fmt.Errorf("idem: binlog: replication connection: %w", err)
	}
	s.conn = conn
	start := s.pos.String()
	if err := conn.StartDump(ctx, start); err != nil {
		return r.dumpError(err, start)
	}
	s.events = make(chan event, 64)
	go func() {
		for {
			ev, err := conn.ReadEvent()
			select {
			case s.events <- event{ev, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	s.check = time.NewTicker(r.cfg.Heartbeat)
	s.heard = time.Now()
	r.log.Debug("binlog replication started", "gtid_position", start)
	return nil
}

// Close ends the session; the lock is released when its connection no
// longer holds it.
func (s *session) Close() {
	r := s.r
	if s.check != nil {
		s.check.Stop()
	}
	if s.until != nil {
		s.until.Stop()
	}
	if s.conn != nil {
		s.conn.Close()
	}
	if s.initial != nil {
		s.initial.Close()
	}
	if s.vis != nil {
		_ = s.vis.Close()
	}
	if r.lock != nil && !r.holds(r.lock) {
		r.release(r.lock)
		r.lock = nil
	}
}

// storePosition stores p as the relay's position.
func (r *source) storePosition(ctx context.Context, p binlogPos) error {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	if _, err := r.db.ExecContext(qctx, r.sql.storePosition, r.cfg.Tables.Outbox, p.gtid, p.file, p.filePos); err != nil {
		return fmt.Errorf("idem: binlog: store the position: %w", err)
	}
	gtid := p.gtid
	r.eng.C.Position.Store(&gtid)
	return nil
}

func (r *source) dumpError(err error, pos string) error {
	if mysqlrepl.IsPurged(err) {
		return &logengine.Delay{Wait: r.cfg.MaxRetryBackoff, Msg: "cannot resume", Err: fmt.Errorf("%w: %s (%v): the server purged the binlog files that hold it (binlog_expire_logs_seconds, expire_logs_days, PURGE BINARY LOGS). The rows still waiting in the outbox can be published: \"idem cdc reset-position\" forgets the position, and the next start publishes them, then reads from the server's current position; events whose rows are gone are lost",
			ErrPositionPurged, pos, err)}
	}
	var se *mysqlrepl.ServerError
	if errors.As(err, &se) && se.Code == 1227 {
		return fmt.Errorf("%w: %v: GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO the relay's user", ErrPrivileges, err)
	}
	return fmt.Errorf("idem: binlog: dump: %w", err)
}

// silenceLimit is how long a server may send nothing before the
// connection is taken for dead.
func silenceLimit(heartbeat time.Duration) time.Duration {
	return max(3*heartbeat, 10*time.Second)
}

// Read reads the binlog until a transaction commits, until passes or
// stopping is closed. Every Heartbeat it checks that the session still
// holds the outbox's lock, and that the server is heard.
func (s *session) Read(ctx context.Context, until time.Time, stopping <-chan struct{}) (logengine.Read, error) {
	r := s.r
	if !s.readEnd.IsZero() {
		// The window was full: the events waited unread.
		s.heard = s.heard.Add(time.Since(s.readEnd))
	}
	defer func() { s.readEnd = time.Now() }()
	// One timer for the session: a Read per transaction.
	if s.until == nil {
		s.until = time.NewTimer(time.Until(until))
	} else {
		s.until.Reset(time.Until(until))
	}
	for {
		select {
		case <-stopping:
			return logengine.Read{}, nil
		case <-s.until.C:
			return logengine.Read{}, nil
		case <-ctx.Done():
			return logengine.Read{}, ctx.Err()
		case <-s.check.C:
			if !r.holds(s.lock) {
				return logengine.Read{}, errors.New("idem: binlog: lost the outbox's lock (its connection ended): stopping, another relay may have taken over")
			}
			if silent := time.Since(s.heard); silent > silenceLimit(r.cfg.Heartbeat) {
				return logengine.Read{}, fmt.Errorf("idem: binlog: the server sent nothing for %v though asked for a heartbeat every %v: the connection is taken for dead",
					silent.Round(time.Second), r.cfg.Heartbeat)
			}
		case e := <-s.events:
			if e.err != nil {
				return logengine.Read{}, fmt.Errorf("idem: binlog: read: %w", e.err)
			}
			s.heard = time.Now()
			if err := s.handle(ctx, e.ev); err != nil {
				return logengine.Read{}, r.columnsChanged(err)
			}
			if s.done != nil {
				tx := s.done
				s.done = nil
				return logengine.Read{Tx: tx}, nil
			}
		}
	}
}

// columnsChanged says what the relay does about rows it cannot name
// (ErrColumnsChanged): on an outbox whose waiting rows it can tell, it
// publishes them from a snapshot of the table; otherwise it stops.
func (r *source) columnsChanged(err error) error {
	if !errors.Is(err, ErrColumnsChanged) {
		return err
	}
	if r.idemTable && r.cfg.Delete == logrelay.DeletePublished {
		// The rows the relay cannot name are still in the table, and
		// it can tell which wait: it publishes them from there.
		r.resnapshot = true
		r.log.Warn("the outbox's columns changed after rows the relay had not read yet, and the binlog holds no column names: publishing the rows waiting in the table instead, in seq order, as at a first start (rows published and not deleted yet are published again), then reading the binlog on from that snapshot; set binlog_row_metadata = FULL to read such rows from the binlog",
			"error", err)
		return &logengine.Delay{Err: err, Said: true}
	}
	// A table without idem's columns, or rows kept: the relay cannot
	// tell which rows of the table wait.
	return &logengine.Delay{Wait: r.cfg.MaxRetryBackoff, Msg: "cannot resume", Err: fmt.Errorf("%w. The relay stops here rather than publish them under wrong names, and tries again every %v. The rows are still in the table unless their writer deleted them: stop the relay, publish them with idem relay, then forget the position (idem cdc reset-position) and start it again; set binlog_row_metadata = FULL (or change the outbox while the relay runs and has read the binlog before the change) so that it does not happen again",
		err, r.cfg.MaxRetryBackoff)}
}

// FirstInvisible waits until the transactions of marks (one of their
// rows' ids each) are committed, and returns 0.
func (s *session) FirstInvisible(ctx context.Context, marks []any) (int, error) {
	ids := make([]string, len(marks))
	for i, m := range marks {
		ids[i] = m.(string)
	}
	return 0, s.r.waitCommitted(ctx, s.vis, ids)
}

// waitCommitted returns once the transactions that wrote the rows of ids
// are committed: a locking read waits for the writer's row locks, which
// the server holds until the storage engine committed (after the binlog
// was written). The session is READ COMMITTED: no gap locks, and a row its
// writer deleted in the same transaction is skipped once committed.
func (r *source) waitCommitted(ctx context.Context, conn *sql.Conn, ids []string) error {
	var n int
	return conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+r.sql.table+` WHERE id IN (`+placeholders(len(ids))+`) LOCK IN SHARE MODE`, anys(ids)...).Scan(&n)
}

// handle reads one event.
func (s *session) handle(ctx context.Context, ev mysqlrepl.Event) error {
	r := s.r
	h := ev.EventHeader()
	if h.NextPos != 0 {
		r.eng.C.FilePos.Store(uint64(h.NextPos))
	}
	switch e := ev.(type) {
	case *mysqlrepl.RotateEvent:
		s.file = e.File
		f := e.File
		r.eng.C.File.Store(&f)
		r.eng.C.FilePos.Store(e.Pos)
	case *mysqlrepl.GTIDEvent:
		s.tx = &txState{standalone: e.Standalone, parts: e.Transactional && !e.Standalone}
		s.pos.maria.Update(mysqlrepl.GTID{Domain: e.Domain, Server: h.ServerID, Seq: e.Seq})
	case *mysqlrepl.MySQLGTIDEvent:
		if e.Anonymous {
			return fmt.Errorf("idem: binlog: a transaction without a GTID (ANONYMOUS_GTID_LOG_EVENT) at %s:%d: the server ran with gtid_mode OFF or OFF_PERMISSIVE when it wrote it, and the relay's position is a GTID set: set gtid_mode = ON, then forget the position (idem cdc reset-position) so that the relay starts from a snapshot", s.file, h.NextPos)
		}
		// MySQL says nothing of a DDL in its GTID event: a group whose
		// first statement is not BEGIN is one (below).
		s.tx = &txState{mysqlFirst: true}
		s.pos.set.Add(e.SID, e.GNO)
	case *mysqlrepl.TransactionPayloadEvent:
		// binlog_transaction_compression: the transaction's events, after
		// its GTID event.
		for _, inner := range e.Events {
			if err := s.handle(ctx, inner); err != nil {
				return err
			}
		}
	case *mysqlrepl.RowsEvent:
		if s.tx == nil || e.Table == nil || e.Table.Schema != r.schema {
			return nil
		}
		if e.Table.Table == r.cfg.Tables.BinlogPosition {
			s.tx.own = true
		}
		if e.Table.Table != r.cfg.Tables.Outbox {
			return nil
		}
		switch e.Kind {
		case mysqlrepl.Insert:
			if err := s.rows(ctx, e); err != nil {
				return err
			}
			if s.tx.parts && len(s.tx.rows) >= logengine.PartRows && s.done == nil {
				// A large transaction goes on in parts as it comes,
				// each waiting for the commit (its first row's lock).
				s.done = &logengine.Tx{Rows: s.tx.rows, Commit: h.Timestamp, Part: true}
				if s.tx.lockID != "" {
					s.done.Mark = s.tx.lockID
				}
				s.tx.rows, s.tx.lockID, s.tx.handed = nil, "", true
			}
			return nil
		case mysqlrepl.Update:
			if r.idemTable {
				return s.requeued(ctx, e)
			}
		}
		return nil
	case *mysqlrepl.XIDEvent:
		if s.tx == nil {
			return nil // the end of a transaction begun before the dump's start
		}
		return s.commit(h)
	case *mysqlrepl.QueryEvent:
		if s.tx == nil {
			return nil
		}
		q := strings.TrimSpace(e.Query)
		if s.tx.mysqlFirst {
			s.tx.mysqlFirst = false
			s.tx.standalone = !strings.EqualFold(q, "BEGIN")
		}
		if s.tx.standalone && strings.Contains(strings.ToLower(q), strings.ToLower(r.cfg.Tables.Outbox)) {
			// DDL that may change the outbox's columns: the rows after it
			// have the table's columns as information_schema gives them
			// now, unless a later DDL changed them again (columnIndex
			// sees the difference).
			s.columns, s.idx = nil, nil
		}
		switch {
		case s.tx.standalone, strings.EqualFold(q, "COMMIT"):
			// A statement logged alone (DDL), or the COMMIT that ends a
			// transaction with non-transactional changes: the end of its
			// GTID's transaction.
			return s.commit(h)
		case strings.EqualFold(q, "ROLLBACK"):
			// A transaction rolled back after changes the server had to
			// log (non-transactional tables): its rows were not committed.
			s.tx.rows = nil
			s.tx.lockID = ""
			return s.commit(h)
		}
		if statementInsert(q, r.cfg.Tables.Outbox) {
			r.eng.C.Unreadable.Add(1)
			r.log.Error("an insert into the outbox was logged as a statement, not as rows (a session with binlog_format STATEMENT or MIXED): the relay cannot read its rows; set binlog_format = ROW for every writer, and publish the rows it left in the table with idem relay",
				"schema", e.Schema, "statement", logengine.Quote([]byte(q)), "binlog_file", s.file, "binlog_pos", h.NextPos)
			return nil
		}
		// BEGIN, SAVEPOINT, ROLLBACK TO SAVEPOINT...: inside the
		// transaction, which goes on. The server logs a rollback to a
		// savepoint only when changes it cannot undo came after it; the
		// outbox's rows after the savepoint are undone.
		if name, ok := savepoint(q, "SAVEPOINT"); ok {
			s.tx.parts = false // what follows may be undone
			if s.tx.savepoints == nil {
				s.tx.savepoints = map[string]int{}
			}
			s.tx.savepoints[name] = len(s.tx.rows)
		} else if name, ok := savepoint(q, "ROLLBACK TO SAVEPOINT", "ROLLBACK TO", "ROLLBACK WORK TO SAVEPOINT", "ROLLBACK WORK TO"); ok {
			if n, ok := s.tx.savepoints[name]; ok && n <= len(s.tx.rows) {
				s.tx.rows = s.tx.rows[:n]
			}
		}
		return nil
	}
	return nil
}

// rows adds the inserts of a rows event into the outbox.
func (s *session) rows(ctx context.Context, e *mysqlrepl.RowsEvent) error {
	idx, err := s.columnIndex(ctx, e.Table)
	if err != nil {
		return err
	}
	rows, err := e.Rows()
	if err != nil {
		s.undecodable(e, err)
		return nil
	}
	return s.addRows(ctx, e, idx, rows)
}

// requeued adds the rows an update took out of quarantine: "idem failed
// retry --relay" re-drives a quarantined row by clearing its
// quarantined_at.
func (s *session) requeued(ctx context.Context, e *mysqlrepl.RowsEvent) error {
	idx, err := s.columnIndex(ctx, e.Table)
	if err != nil {
		return err
	}
	q, okQ := idx["quarantined_at"]
	p, okP := idx["published_at"]
	if !okQ || !okP {
		return nil
	}
	before, after, err := e.Images()
	if err != nil {
		s.undecodable(e, err)
		return nil
	}
	var rows [][]any
	for i := range min(len(before), len(after)) {
		b, a := before[i], after[i]
		if q < len(b) && q < len(a) && p < len(a) && b[q] != nil && a[q] == nil && a[p] == nil {
			rows = append(rows, a)
		}
	}
	return s.addRows(ctx, e, idx, rows)
}

func (s *session) undecodable(e *mysqlrepl.RowsEvent, err error) {
	r := s.r
	r.eng.C.Unreadable.Add(1)
	r.log.Error("rows written into the outbox cannot be decoded (a column type the relay does not read?); skipped: publish them another way",
		"table", r.sql.table, "binlog_file", s.file, "binlog_pos", e.NextPos, "error", err)
}

// addRows adds outbox rows, as the binlog gives their columns, to the
// transaction being read.
func (s *session) addRows(ctx context.Context, e *mysqlrepl.RowsEvent, idx map[string]int, rows [][]any) error {
	for _, row := range rows {
		if i, ok := idx["quarantined_at"]; ok && i < len(row) && row[i] != nil {
			continue // set aside as written: a parked message
		}
		if i, ok := idx["not_before"]; ok && s.r.delayTable && i < len(row) && row[i] != nil {
			// It waits in the table for its time: the engine publishes it
			// then, and deletes it. The position moves on.
			s.r.eng.C.Delayed.Add(1)
			continue
		}
		rec, err := outboxcodec.DecodeText(func(col string) ([]byte, bool) {
			i, ok := idx[col]
			if !ok || i >= len(row) {
				return nil, false
			}
			if col == "payload_binary" && row[i] != nil {
				// DecodeText reads a bytea's hex text; the binlog
				// gives a BLOB's bytes.
				return outboxcodec.EncodeBytea(text(row[i])), true
			}
			return text(row[i]), true
		})
		if err != nil && rec.Unreadable == nil {
			rec.Unreadable = &driver.UnreadableError{Problems: []error{err}}
		}
		if rec.OccurredAt.IsZero() {
			rec.OccurredAt = e.Timestamp
		}
		if err := s.add(ctx, rec); err != nil {
			return err
		}
	}
	return nil
}

// text returns a decoded binlog value as the text outboxcodec.DecodeText
// reads.
func text(v any) []byte {
	switch x := v.(type) {
	case nil:
		return nil
	case []byte:
		return x
	case string:
		return []byte(x)
	case int64:
		return strconv.AppendInt(nil, x, 10)
	case uint64:
		return strconv.AppendUint(nil, x, 10)
	case float64:
		return strconv.AppendFloat(nil, x, 'g', -1, 64)
	case time.Time:
		return []byte(x.UTC().Format("2006-01-02 15:04:05.999999-07"))
	}
	return []byte(fmt.Sprint(v))
}

// add adds a decoded row to the transaction being read, or quarantines it
// when it cannot become a message.
func (s *session) add(ctx context.Context, rec driver.OutboxRecord) error {
	r := s.r
	if s.tx.lockID == "" && rec.RawID != "" {
		s.tx.lockID = rec.RawID
	}
	del := ""
	if r.cfg.Delete == logrelay.DeletePublished {
		del = rec.RawID
	}
	row, err := logengine.NewRow(rec, del)
	if err != nil {
		return r.eng.Unreadable(ctx, &rec, err)
	}
	row.Refusals = rec.Attempts
	s.tx.rows = append(s.tx.rows, row)
	return nil
}

// commit ends the transaction being read.
func (s *session) commit(h *mysqlrepl.Header) error {
	tx := s.tx
	s.tx = nil
	s.done = &logengine.Tx{Rows: tx.rows, Pos: binlogPos{gtid: s.pos.String(), file: s.file, filePos: uint64(h.NextPos)}, Commit: h.Timestamp}
	if len(tx.rows) == 0 && !tx.handed {
		s.done.Foreign = !tx.own
	} else if tx.lockID != "" {
		s.done.Mark = tx.lockID
	}
	return nil
}

// Confirm stores the position c.Pos, after the published rows are
// deleted. The position moves with every transaction of the server, the
// relay's own writes of it included: it is stored at once after events, at
// most every idleStoreInterval after other sessions' transactions only,
// and never for the relay's own writes alone (which would write again and
// again); with c.Force (at a stop) whenever it moved.
func (s *session) Confirm(ctx context.Context, c logengine.Confirm) (bool, error) {
	if c.Pos == nil {
		return false, nil
	}
	p := c.Pos.(binlogPos)
	if p.gtid == s.stored {
		return true, nil
	}
	if !c.Events && (!c.Foreign || time.Since(s.storedAt) < idleStoreInterval) && !c.Force {
		return false, nil
	}
	if fault.Enabled {
		fault.Point(fault.CDCAfterPublishBeforeConfirm)
	}
	if err := s.r.storePosition(ctx, p); err != nil {
		return false, err
	}
	if fault.Enabled {
		fault.Point(fault.CDCAfterConfirm)
	}
	s.stored = p.gtid
	s.storedAt = time.Now()
	return true, nil
}

// archive inserts recs into the archive in tx, in the order of publication
// (the archive's seq follows it), and returns how many it inserted. An
// event archived already (the binlog gave its transaction again after a
// crash) is kept as it was. When the batch fails on a value the table
// refuses (dataError: a foreign outbox's column wider than the archive's),
// the events are inserted one at a time, and one refused is logged at error
// level with its content and left out, rather than hold the position for
// good: a failed statement leaves the transaction's other statements be.
func (r *source) archive(ctx context.Context, tx *sql.Tx, recs []*driver.OutboxRecord) (int64, error) {
	insert := func(recs []*driver.OutboxRecord) (int64, error) {
		args := make([]any, 0, 11*len(recs))
		for _, rec := range recs {
			var payload, headers, contentType, bin any
			if rec.ContentType != "" {
				contentType = rec.ContentType
			}
			if !idem.IsJSONContentType(rec.ContentType) {
				bin = append([]byte{}, rec.Payload...)
			} else if rec.Payload != nil {
				payload = string(rec.Payload)
			}
			if rec.RawHeaders != nil {
				headers = string(rec.RawHeaders)
			}
			args = append(args, r.cfg.Tables.Outbox, rec.RawID, rec.AggregateType, rec.AggregateID, rec.Type, payload,
				rec.OccurredAt.UTC().Format(dateTime6), rec.AggregateVersion, headers, contentType, bin)
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO `+r.sql.archive+` (outbox_table, id, aggregatetype, aggregateid, type, payload,
    occurred_at, aggregate_version, headers, content_type, payload_binary) VALUES `+strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?, ?, COALESCE(?, '{}'), ?, ?),", len(recs)), ",")+`
ON DUPLICATE KEY UPDATE id = id`, args...)
		if err != nil {
			return 0, err
		}
		// ON DUPLICATE KEY UPDATE counts 1 per row inserted, 0 per row
		// kept.
		return res.RowsAffected()
	}
	n, err := insert(recs)
	if err == nil || !dataError(err) {
		if err != nil {
			return 0, fmt.Errorf("archive the published events: %w", err)
		}
		return n, nil
	}
	n = 0
	for _, rec := range recs {
		a, err := insert([]*driver.OutboxRecord{rec})
		switch {
		case err == nil:
			n += a
		case dataError(err):
			r.log.Error("a published event cannot be archived: the archive refuses one of its values; it was published, and idem replay will not find it",
				"id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "type", rec.Type,
				"payload", string(rec.Payload), "headers", string(rec.RawHeaders), "error", err)
		default:
			return 0, fmt.Errorf("archive the published events: %w", err)
		}
	}
	return n, nil
}

// dataError reports whether a statement failed on a value in strict mode:
// too long (1406), not in the column's character set (1366), out of range
// (1264), JSON the column refuses (4025, MariaDB's JSON check; 3140,
// MySQL's). Trying it again as it is cannot help.
func dataError(err error) bool {
	var me *gomysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1406, 1366, 1264, 4025, 3140:
		return true
	}
	return false
}

// dateTime6 is how a DATETIME(6) value is written: UTC, microseconds.
const dateTime6 = "2006-01-02 15:04:05.000000"

// loadPosition returns the stored position, "" when none is.
func (r *source) loadPosition(ctx context.Context) (string, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var pos string
	err := r.db.QueryRowContext(qctx, r.sql.loadPosition, r.cfg.Tables.Outbox).Scan(&pos)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("idem: binlog: read the stored position: %w", err)
	}
	return pos, nil
}

// Monitor measures the binlog written after what the relay read.
func (r *source) Monitor(rctx context.Context, stopping <-chan struct{}) {
	t := time.NewTicker(r.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-stopping:
			return
		case <-t.C:
		}
		f := r.eng.C.File.Load()
		if f == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(rctx, r.cfg.QueryTimeout)
		lag, err := r.lagBytes(ctx, *f, int64(r.eng.C.FilePos.Load()))
		cancel()
		if err == nil {
			r.eng.C.LagBytes.Store(lag)
		}
	}
}

// lagBytes sums the binlog after file:pos.
func (r *source) lagBytes(ctx context.Context, file string, pos int64) (int64, error) {
	rows, err := r.db.QueryContext(ctx, `SHOW BINARY LOGS`)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var lag int64
	for rows.Next() {
		var name string
		var size int64
		dest := []any{&name, &size}
		for len(dest) < len(cols) {
			dest = append(dest, new(any))
		}
		if err := rows.Scan(dest...); err != nil {
			return 0, err
		}
		switch {
		case name == file:
			lag += max(0, size-pos)
		case name > file:
			lag += size
		}
	}
	return lag, rows.Err()
}
