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
)

// ErrPositionPurged is wrapped by the error of a relay whose stored
// position is no longer in the server's binlog (purged by
// binlog_expire_logs_seconds, expire_logs_days or PURGE BINARY LOGS).
// ResetPosition ("idem cdc reset-position") forgets the position: the next
// start publishes the rows still waiting in the outbox, then reads the
// binlog from the server's current position.
var ErrPositionPurged = errors.New("idem: binlog: the stored position is no longer in the server's binlog")

// run takes the outbox's lock, then reads the binlog until Stop,
// reconnecting after failures with capped backoff.
func (r *Relay) run() {
	stopping := r.base.Stopping()
	lock := r.lock // taken by Start when free
	r.lock = nil
	defer func() {
		if lock != nil {
			r.release(lock)
		}
	}()
	failures := 0
	for {
		if r.stopping() {
			return
		}
		var err error
		if lock == nil {
			lock, err = r.acquire()
		}
		var read bool
		if lock != nil {
			read, err = r.session(lock)
			if r.stopping() {
				return
			}
			if !r.holds(lock) {
				r.release(lock)
				lock = nil
			}
		}
		if read {
			failures = 0
		}
		var d time.Duration
		switch {
		case lock == nil && err == nil:
			if !r.stats.waiting.Swap(true) {
				r.log.Info("another process reads this outbox's binlog; waiting to take over")
			}
			d = r.cfg.StandbyPoll
		case errors.Is(err, ErrColumnsChanged) && r.idemTable && r.cfg.Delete == DeletePublished:
			// The rows the relay cannot name are still in the table, and
			// it can tell which wait: it publishes them from there.
			r.resnapshot = true
			failures++
			d = r.backoff(failures)
			r.log.Warn("the outbox's columns changed after rows the relay had not read yet, and the binlog holds no column names: publishing the rows waiting in the table instead, in seq order, as at a first start (rows published and not deleted yet are published again), then reading the binlog on from that snapshot; set binlog_row_metadata = FULL to read such rows from the binlog",
				"error", err)
		default:
			failures++
			r.stats.waiting.Store(false)
			if errors.Is(err, ErrColumnsChanged) {
				// A table without idem's columns, or rows kept: the relay
				// cannot tell which rows of the table wait.
				err = fmt.Errorf("%w. The relay stops here rather than publish them under wrong names, and tries again every %v. The rows are still in the table unless their writer deleted them: stop the relay, publish them with idem relay, then forget the position (idem cdc reset-position) and start it again; set binlog_row_metadata = FULL (or change the outbox while the relay runs and has read the binlog before the change) so that it does not happen again",
					err, r.cfg.MaxRetryBackoff)
			}
			r.setErr(err)
			d = r.backoff(failures)
			if errors.Is(err, ErrPositionPurged) || errors.Is(err, ErrColumnsChanged) {
				d = r.cfg.MaxRetryBackoff
				r.errs.replication.Warn(r.ctx, "cannot resume", err, "retry_in", d.Round(time.Millisecond))
			} else {
				r.errs.replication.Warn(r.ctx, "binlog replication stopped; reconnecting", err, "retry_in", d.Round(time.Millisecond))
			}
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-stopping:
			t.Stop()
			return
		}
	}
}

// acquire tries to take the outbox's named lock on a connection of its
// own, which holds it for the relay's life: the server releases it when
// that connection ends, the relay's process with it. It returns nil and no
// error when another session holds it.
func (r *Relay) acquire() (*sql.Conn, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.QueryTimeout)
	defer cancel()
	return r.acquireCtx(ctx)
}

func (r *Relay) acquireCtx(ctx context.Context) (*sql.Conn, error) {
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
	if r.stats.waiting.Swap(false) {
		r.log.Info("took the outbox's binlog over")
	}
	return conn, nil
}

// holds reports whether the lock's connection still holds the lock.
func (r *Relay) holds(lock *sql.Conn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	var mine sql.NullBool
	err := lock.QueryRowContext(ctx, `SELECT IS_USED_LOCK(?) = CONNECTION_ID()`, r.sql.lockName).Scan(&mine)
	return err == nil && mine.Valid && mine.Bool
}

func (r *Relay) release(lock *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = lock.ExecContext(ctx, `DO RELEASE_LOCK(?)`, r.sql.lockName)
	_ = lock.Close()
}

// txState is the transaction being read.
type txState struct {
	entries []*entry
	lockID  string
	// own is set when the transaction wrote the relay's position table.
	own bool
	// standalone: a statement logged alone (DDL), ended by its query
	// event, without XID or COMMIT.
	standalone bool
	// savepoints are the entries read when each savepoint was set.
	savepoints map[string]int
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

// session is one replication connection.
type session struct {
	r    *Relay
	pipe *pipeline
	conn *mysqlrepl.Conn
	tx   *txState
	pos  mysqlrepl.Position // after the last transaction read
	file string
	// toDelete holds the ids of published rows not deleted yet, and
	// toArchive the events published and not archived yet
	// (Config.ArchiveRetention), in binlog order.
	toDelete  []string
	toArchive []*driver.OutboxRecord
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
	// pending is the end of the last transaction confirmed and not stored
	// yet; pendingEvents and pendingForeign say what it passed.
	pending                       *entry
	pendingEvents, pendingForeign bool
}

// idleStoreInterval is how often the position is stored when only
// transactions without events moved it.
const idleStoreInterval = 10 * time.Second

// event is what the reading goroutine passes on.
type event struct {
	ev  mysqlrepl.Event
	err error
}

// session reads the binlog from the stored position (or, at the first
// start, publishes the rows waiting in the outbox first) until Stop, an
// error, or the loss of the lock. read reports whether it read at all.
func (r *Relay) session(lock *sql.Conn) (read bool, err error) {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	vis, err := r.db.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("idem: binlog: connect: %w", err)
	}
	defer vis.Close()
	if _, err := vis.ExecContext(ctx, `SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED`); err != nil {
		return false, fmt.Errorf("idem: binlog: connect: %w", err)
	}
	s := &session{r: r, pipe: newPipeline(ctx, r, vis)}
	defer func() {
		cancel()
		s.pipe.wait()
		r.stats.inFlight.Store(0)
		r.stats.oldest.Store(0)
	}()

	stored, err := r.loadPosition(ctx)
	if err != nil {
		return false, err
	}
	start := stored
	if stored == "" || r.resnapshot {
		// The snapshot's position goes through the pipeline after its
		// rows, and is stored once they are published.
		if start, err = s.initial(ctx); err != nil {
			return false, err
		}
		r.resnapshot = false
	} else {
		p := stored // stored changes below; Stats reads p
		r.stats.position.Store(&p)
	}
	if s.pos, err = mysqlrepl.ParsePosition(start); err != nil {
		return false, fmt.Errorf("idem: binlog: the stored position %q: %w", start, err)
	}
	s.stored = stored
	stored = start

	conn, err := mysqlrepl.Dial(ctx, r.repl)
	if err != nil {
		return false, fmt.Errorf("idem: binlog: replication connection: %w", err)
	}
	s.conn = conn
	defer conn.Close()
	if err := conn.StartDump(ctx, stored); err != nil {
		return false, r.dumpError(err, stored)
	}
	if r.delayTable {
		// Delayed rows are published from the table by the relay that
		// holds the outbox, and by it only.
		dueCtx, stopDue := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.dueLoop(dueCtx) }()
		defer func() { stopDue(); <-done }()
	}
	events := make(chan event, 64)
	go func() {
		for {
			ev, err := conn.ReadEvent()
			select {
			case events <- event{ev, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return s.loop(ctx, lock, events)
}

func (r *Relay) dumpError(err error, pos string) error {
	if mysqlrepl.IsPurged(err) {
		return fmt.Errorf("%w: %s (%v): the server purged the binlog files that hold it (binlog_expire_logs_seconds, expire_logs_days, PURGE BINARY LOGS). The rows still waiting in the outbox can be published: \"idem cdc reset-position\" forgets the position, and the next start publishes them, then reads from the server's current position; events whose rows are gone are lost",
			ErrPositionPurged, pos, err)
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

func (s *session) loop(ctx context.Context, lock *sql.Conn, events <-chan event) (read bool, err error) {
	r := s.r
	stopping := r.base.Stopping()
	r.stats.streaming.Store(true)
	defer r.stats.streaming.Store(false)
	r.setErr(nil)
	r.errs.replication.OK(ctx)
	r.log.Debug("binlog replication started", "gtid_position", s.pos.String())
	flush := time.NewTicker(r.cfg.FlushInterval)
	defer flush.Stop()
	check := time.NewTicker(r.cfg.Heartbeat)
	defer check.Stop()
	heard := time.Now()
	for {
		in := events
		if s.pipe.full() {
			in = nil // the window is full: read nothing until it frees
			heard = time.Now()
		}
		select {
		case <-stopping:
			if !s.pipe.drainWait(r.ctx) {
				return read, nil
			}
			return read, s.flush(ctx, true)
		case <-flush.C:
			if err := s.flush(ctx, false); err != nil {
				return read, err
			}
		case <-check.C:
			if !r.holds(lock) {
				return read, errors.New("idem: binlog: lost the outbox's lock (its connection ended): stopping, another relay may have taken over")
			}
			if silent := time.Since(heard); silent > silenceLimit(r.cfg.Heartbeat) {
				return read, fmt.Errorf("idem: binlog: the server sent nothing for %v though asked for a heartbeat every %v: the connection is taken for dead",
					silent.Round(time.Second), r.cfg.Heartbeat)
			}
		case <-s.pipe.progress:
			// The window may have freed. (drainWait, once stopping, looks
			// at the count first: a signal taken here is not missed.)
		case e := <-in:
			if e.err != nil {
				return read, fmt.Errorf("idem: binlog: read: %w", e.err)
			}
			heard = time.Now()
			read = true
			if err := s.handle(ctx, e.ev); err != nil {
				return read, err
			}
		}
	}
}

// handle reads one event.
func (s *session) handle(ctx context.Context, ev mysqlrepl.Event) error {
	r := s.r
	h := ev.EventHeader()
	if h.NextPos != 0 {
		r.stats.filePos.Store(uint64(h.NextPos))
	}
	switch e := ev.(type) {
	case *mysqlrepl.RotateEvent:
		s.file = e.File
		f := e.File
		r.stats.file.Store(&f)
		r.stats.filePos.Store(e.Pos)
	case *mysqlrepl.GTIDEvent:
		s.tx = &txState{standalone: e.Standalone}
		s.pos.Update(mysqlrepl.GTID{Domain: e.Domain, Server: h.ServerID, Seq: e.Seq})
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
			return s.rows(ctx, e)
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
			s.tx.entries = nil
			s.tx.lockID = ""
			return s.commit(h)
		}
		if statementInsert(q, r.cfg.Tables.Outbox) {
			r.stats.unreadable.Add(1)
			r.log.Error("an insert into the outbox was logged as a statement, not as rows (a session with binlog_format STATEMENT or MIXED): the relay cannot read its rows; set binlog_format = ROW for every writer, and publish the rows it left in the table with idem relay",
				"schema", e.Schema, "statement", quote([]byte(q)), "binlog_file", s.file, "binlog_pos", h.NextPos)
			return nil
		}
		// BEGIN, SAVEPOINT, ROLLBACK TO SAVEPOINT...: inside the
		// transaction, which goes on. The server logs a rollback to a
		// savepoint only when changes it cannot undo came after it; the
		// outbox's rows after the savepoint are undone.
		if name, ok := savepoint(q, "SAVEPOINT"); ok {
			if s.tx.savepoints == nil {
				s.tx.savepoints = map[string]int{}
			}
			s.tx.savepoints[name] = len(s.tx.entries)
		} else if name, ok := savepoint(q, "ROLLBACK TO SAVEPOINT", "ROLLBACK TO", "ROLLBACK WORK TO SAVEPOINT", "ROLLBACK WORK TO"); ok {
			if n, ok := s.tx.savepoints[name]; ok && n <= len(s.tx.entries) {
				s.tx.entries = s.tx.entries[:n]
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
	r.stats.unreadable.Add(1)
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
			// It waits in the table for its time: publishDue publishes it
			// then, and deletes it. The position moves on.
			s.r.stats.held.Add(1)
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
	msg, err := outboxcodec.Message(rec)
	if err != nil {
		r.stats.unreadable.Add(1)
		return r.quarantine(ctx, rec, err)
	}
	e := &entry{msg: msg, hasMsg: true, key: rec.AggregateType + "\x00" + rec.AggregateID, rec: &rec}
	if r.cfg.Delete == DeletePublished {
		e.id = rec.RawID
	}
	s.tx.entries = append(s.tx.entries, e)
	return nil
}

// commit ends the transaction being read.
func (s *session) commit(h *mysqlrepl.Header) error {
	r := s.r
	tx := s.tx
	s.tx = nil
	end := &entry{pos: s.pos.String(), file: s.file, filePos: uint64(h.NextPos), commit: h.Timestamp}
	if len(tx.entries) == 0 {
		end.foreign = !tx.own
		s.pipe.add([]*entry{end})
		return nil
	}
	r.stats.txs.Add(1)
	if fault.Enabled {
		fault.Point(fault.CDCAfterReceive)
	}
	last := tx.entries[len(tx.entries)-1]
	last.pos, last.file, last.filePos = end.pos, end.file, end.filePos
	tx.entries[0].lockID = tx.lockID
	for _, e := range tx.entries {
		e.commit = h.Timestamp
	}
	s.pipe.add(tx.entries)
	return nil
}

// flush deletes the published rows, then stores the position they reach.
// With force (at a stop) it stores any position that moved.
func (s *session) flush(ctx context.Context, force bool) error {
	r := s.r
	end, ids, archive, commits, events, foreign := s.pipe.confirmed()
	s.toDelete = append(s.toDelete, ids...)
	s.toArchive = append(s.toArchive, archive...)
	if end != nil {
		if s.pending == nil || end.pos != s.pending.pos {
			s.pending = end
		}
		s.pendingEvents = s.pendingEvents || events
		s.pendingForeign = s.pendingForeign || foreign
	}
	end = s.pending
	if end == nil && len(s.toDelete) == 0 && len(s.toArchive) == 0 {
		return nil
	}
	if len(s.toDelete) > 0 || len(s.toArchive) > 0 {
		if err := r.deleteRows(ctx, s.toDelete, s.toArchive); err != nil {
			return err
		}
		s.toDelete, s.toArchive = s.toDelete[:0], s.toArchive[:0]
	}
	if end == nil || end.pos == s.stored {
		return nil
	}
	// The position moves with every transaction of the server, the
	// relay's own writes of it included: it is stored at once after events,
	// at most every idleStoreInterval after other sessions' transactions
	// only, and never for the relay's own writes alone (which would write
	// again and again).
	if !s.pendingEvents && (!s.pendingForeign || time.Since(s.storedAt) < idleStoreInterval) && !force {
		return nil
	}
	if fault.Enabled {
		fault.Point(fault.CDCAfterPublishBeforeConfirm)
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	if _, err := r.db.ExecContext(qctx, r.sql.storePosition, r.cfg.Tables.Outbox, end.pos, end.file, end.filePos); err != nil {
		return fmt.Errorf("idem: binlog: store the position: %w", err)
	}
	if fault.Enabled {
		fault.Point(fault.CDCAfterConfirm)
	}
	s.stored = end.pos
	s.storedAt = time.Now()
	s.pending, s.pendingEvents, s.pendingForeign = nil, false, false
	pos := end.pos
	r.stats.position.Store(&pos)
	if r.cfg.Observer.Confirm != nil {
		now := time.Now()
		for _, c := range commits {
			r.cfg.Observer.Confirm(now.Sub(c))
		}
	}
	return nil
}

// deleteRows deletes published rows by id and, when the relay archives
// what it publishes, archives the events recs in the same transactions:
// deleted and archived together, or neither.
func (r *Relay) deleteRows(ctx context.Context, ids []string, recs []*driver.OutboxRecord) error {
	for len(ids) > 0 || len(recs) > 0 {
		n, m := min(len(ids), 1000), min(len(recs), 1000)
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		d, err := r.deleteBatch(qctx, ids[:n], recs[:m])
		cancel()
		if err != nil {
			return fmt.Errorf("idem: binlog: delete published rows: %w", err)
		}
		r.stats.deleted.Add(d)
		ids, recs = ids[n:], recs[m:]
	}
	return nil
}

// deleteBatch deletes the rows of ids and archives recs in one
// transaction, and returns how many rows it deleted.
func (r *Relay) deleteBatch(ctx context.Context, ids []string, recs []*driver.OutboxRecord) (int64, error) {
	del := func(ex interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}) (int64, error) {
		if len(ids) == 0 {
			return 0, nil
		}
		args := make([]any, len(ids))
		for i, id := range ids {
			args[i] = id
		}
		res, err := ex.ExecContext(ctx, `DELETE FROM `+r.sql.table+` WHERE id IN (`+placeholders(len(ids))+`)`, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	if len(recs) == 0 {
		return del(r.db)
	}
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	archived, err := r.archive(ctx, tx, recs)
	if err != nil {
		return 0, err
	}
	n, err := del(tx)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	r.stats.archived.Add(archived)
	return n, nil
}

// archive inserts recs into the archive in tx, in the order of publication
// (the archive's seq follows it), and returns how many it inserted. An
// event archived already (the binlog gave its transaction again after a
// crash) is kept as it was. When the batch fails on a value the table
// refuses (dataError: a foreign outbox's column wider than the archive's),
// the events are inserted one at a time, and one refused is logged at error
// level with its content and left out, rather than hold the position for
// good: a failed statement leaves the transaction's other statements be.
func (r *Relay) archive(ctx context.Context, tx *sql.Tx, recs []*driver.OutboxRecord) (int64, error) {
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
func (r *Relay) loadPosition(ctx context.Context) (string, error) {
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

// monitor measures the binlog written after what the relay read.
func (r *Relay) monitor() {
	stopping := r.base.Stopping()
	t := time.NewTicker(r.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-stopping:
			return
		case <-t.C:
		}
		f := r.stats.file.Load()
		if f == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(r.ctx, r.cfg.QueryTimeout)
		lag, err := r.lagBytes(ctx, *f, int64(r.stats.filePos.Load()))
		cancel()
		if err == nil {
			r.stats.lagBytes.Store(lag)
		}
	}
}

// lagBytes sums the binlog after file:pos.
func (r *Relay) lagBytes(ctx context.Context, file string, pos int64) (int64, error) {
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
