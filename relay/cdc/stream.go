package cdc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/outboxcodec"
	"github.com/idem-go/idem/relay/internal/logengine"
	"github.com/idem-go/idem/relay/logrelay"
)

// Lead returns the reader of one session: the rows waiting since the
// slot's creation first, if any, then the slot's stream (Start).
func (r *source) Lead(ctx context.Context) (logengine.Reader, error) {
	if r.slotLater {
		if err := r.ensureSlot(ctx); err != nil {
			return nil, err
		}
		r.slotLater = false
	}
	s := &session{r: r, relations: map[uint32]*pglogrepl.RelationMessage{}}
	if r.initial != nil { // not a nil *initialRows in the interface
		s.initial, r.initial = r.initial, nil
	}
	return s, nil
}

// txState is the transaction being read.
type txState struct {
	xid    uint32
	commit time.Time
	rows   []logengine.Row
}

// session is the state of one replication connection.
type session struct {
	r         *source
	initial   logengine.Initial
	conn      *pgconn.PgConn
	relations map[uint32]*pglogrepl.RelationMessage
	tx        *txState
	done      *logengine.Tx // a transaction read, returned by Read
	reply     bool          // the server asked for a reply

	flushed    pglogrepl.LSN // confirmed to the server
	walEnd     pglogrepl.LSN // the server's position in its last keepalive
	lastStatus time.Time
	// heard is when the server's last message was read, moved forward by
	// the time the relay did not read (its window full): silenceLimit.
	heard, readEnd time.Time
}

// Initial returns the rows waiting since the slot's creation, if this
// session is the first after it.
func (s *session) Initial() logengine.Initial { return s.initial }

// Start starts reading the slot. A slot another process reads is
// logengine.ErrStandby; a missing slot (a failover to a standby without a
// copy of it, or a drop) is created again, and the next session publishes
// the rows still in the table first.
func (s *session) Start(ctx context.Context) error {
	r := s.r
	conn, err := pgconn.ConnectConfig(ctx, r.replCfg)
	if err != nil {
		return replicationErrorOn(r.host, err, r.replCfg.User)
	}
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names '" + r.cfg.Publication + "'",
			"messages 'true'",
		},
	})
	if err != nil {
		_ = conn.Close(context.Background())
		err = slotErrorOn(r.host, err, r.cfg.Slot, r.replCfg.User)
		switch {
		case errors.Is(err, ErrSlotActive):
			return fmt.Errorf("%w: %w", logengine.ErrStandby, err)
		case errors.Is(err, idem.ErrNotFound):
			if err = r.recreateSlot(err); err == nil {
				return logengine.ErrAgain
			}
		}
		return err
	}
	s.conn = conn
	s.heard = time.Now()
	return nil
}

// Close ends the replication connection.
func (s *session) Close() {
	if s.conn != nil {
		_ = s.conn.Close(context.Background())
	}
}

// silenceLimit is how long a server may send nothing, while the relay
// waits for it and asks it for a reply every standbyInterval, before the
// connection is taken for dead: three intervals, at least 10 s.
func silenceLimit(standbyInterval time.Duration) time.Duration {
	return max(3*standbyInterval, 10*time.Second)
}

// Read reads the stream until a transaction commits, the server asks for a
// reply, a standby status update is due (StandbyInterval), until passes or
// stopping is closed.
func (s *session) Read(ctx context.Context, until time.Time, stopping <-chan struct{}) (logengine.Read, error) {
	r := s.r
	if !s.readEnd.IsZero() {
		// The server's messages waited unread meanwhile: not a silence.
		s.heard = s.heard.Add(time.Since(s.readEnd))
	}
	defer func() { s.readEnd = time.Now() }()
	for {
		select {
		case <-stopping:
			return logengine.Read{}, nil
		default:
		}
		now := time.Now()
		deadline := until
		if standby := s.lastStatus.Add(r.cfg.StandbyInterval); standby.Before(deadline) {
			deadline = standby
			if !now.Before(deadline) {
				return logengine.Read{Flush: true}, nil
			}
		}
		if !now.Before(deadline) {
			return logengine.Read{}, nil
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil && !s.conn.IsClosed() {
				// Each standby status update asks the server for a reply: a
				// server that stays silent is frozen or cut off (no TCP
				// reset comes from a machine gone or a partition).
				if silent := time.Since(s.heard); silent > silenceLimit(r.cfg.StandbyInterval) {
					return logengine.Read{}, fmt.Errorf("idem: cdc: the server answered nothing for %v though asked to every %v: the connection is taken for dead (a frozen or unreachable server; the URL's hosts are tried again)",
						silent.Round(time.Second), r.cfg.StandbyInterval)
				}
				continue
			}
			return logengine.Read{}, fmt.Errorf("idem: cdc: receive: %w", err)
		}
		s.heard = time.Now()
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.copyData(ctx, m.Data); err != nil {
				return logengine.Read{}, err
			}
		case *pgproto3.ErrorResponse:
			return logengine.Read{}, fmt.Errorf("idem: cdc: server: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return logengine.Read{}, errors.New("idem: cdc: the server ended the replication")
		}
		if s.done != nil || s.reply {
			rd := logengine.Read{Tx: s.done, Flush: s.reply}
			s.done, s.reply = nil, false
			return rd, nil
		}
	}
}

func (s *session) copyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("idem: cdc: keepalive: %w", err)
		}
		s.walEnd = max(s.walEnd, k.ServerWALEnd)
		s.reply = s.reply || k.ReplyRequested
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("idem: cdc: XLogData: %w", err)
		}
		return s.logical(ctx, x.WALData)
	}
	return nil
}

func (s *session) logical(ctx context.Context, data []byte) error {
	r := s.r
	m, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("idem: cdc: decode pgoutput message: %w", err)
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		s.relations[m.RelationID] = m
	case *pglogrepl.BeginMessage:
		s.tx = &txState{xid: m.Xid, commit: m.CommitTime}
	case *pglogrepl.InsertMessage:
		rel := s.relations[m.RelationID]
		if s.tx == nil || rel == nil || rel.Namespace != r.schema || rel.RelationName != r.cfg.Tables.Outbox {
			return nil // another table of the publication
		}
		if quarantinedInsert(rel, m.Tuple) {
			return nil // set aside as it was written: a parked message
		}
		if r.sql.due != "" && delayedInsert(rel, m.Tuple) {
			// It waits in the table for its time: the engine publishes it
			// then, and deletes it. The stream's position moves on.
			r.eng.C.Delayed.Add(1)
			return nil
		}
		rec, err := decodeTuple(rel, m.Tuple)
		if err != nil && rec.Unreadable == nil {
			// A value of a foreign table's column that idem cannot read:
			// quarantine the row like any unreadable one, rather than fail
			// on it at every reconnection.
			rec.Unreadable = &driver.UnreadableError{Problems: []error{err}}
		}
		return s.add(ctx, rec, true, nil, 0)
	case *pglogrepl.LogicalDecodingMessage:
		if m.Prefix != r.cfg.MessagePrefix {
			return nil
		}
		if !m.Transactional || s.tx == nil {
			r.eng.C.Unreadable.Add(1)
			r.log.Warn("ignored a non-transactional WAL message with the outbox's prefix: it is not tied to a commit (outbox.NewLogWriter writes transactional ones)",
				"lsn", m.LSN.String(), "content", logengine.Quote(m.Content))
			return nil
		}
		if r.cfg.RowsOnly && !r.warnedRowsOnly.Swap(true) {
			r.log.Warn("read a WAL message of the outbox though Config.RowsOnly (--rows-only) says every event is a row: a failover to a standby without the slot would lose such events; publishing it",
				"lsn", m.LSN.String())
		}
		rec := outboxcodec.DecodeLogMessage(m.Content)
		return s.add(ctx, rec, false, m.Content, m.LSN)
	case *pglogrepl.CommitMessage:
		if s.tx == nil {
			return nil
		}
		tx := s.tx
		s.tx = nil
		s.done = &logengine.Tx{Rows: tx.rows, Pos: m.TransactionEndLSN, Commit: tx.commit}
		if len(tx.rows) > 0 {
			s.done.Mark = tx.xid
		}
	}
	return nil
}

// add adds a decoded row or WAL message to the transaction being read, or,
// when it cannot become a message, quarantines it: a row in place, a WAL
// message as a quarantined row holding its content (a row the writer deleted
// meanwhile, or a table without idem's columns, is logged at error level
// with its content instead). It fails only when the database does: the
// session then ends, and the next reads the transaction again.
func (s *session) add(ctx context.Context, rec driver.OutboxRecord, row bool, raw []byte, lsn pglogrepl.LSN) error {
	r := s.r
	if rec.OccurredAt.IsZero() {
		rec.OccurredAt = s.tx.commit // a table without occurred_at
	}
	del := ""
	if row && r.cfg.Delete == logrelay.DeletePublished {
		del = rec.RawID
	}
	e, err := logengine.NewRow(rec, del)
	if err == nil {
		e.WAL = !row
		s.tx.rows = append(s.tx.rows, e)
		if len(s.tx.rows) >= logengine.PartRows {
			// pgoutput sends a transaction once committed, whole: hand a
			// large one on as it comes, in parts.
			s.done = &logengine.Tx{Rows: s.tx.rows, Commit: s.tx.commit, Mark: s.tx.xid, Part: true}
			s.tx.rows = nil
		}
		return nil
	}
	if row {
		// The row's transaction is in the log before other sessions see
		// it: the quarantine waits for it.
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		werr := r.waitVisible(qctx, []uint32{s.tx.xid})
		cancel()
		if werr != nil {
			return fmt.Errorf("idem: cdc: quarantine what cannot be published: %w", werr)
		}
		return r.eng.Unreadable(ctx, &rec, err)
	}
	r.eng.C.Unreadable.Add(1)
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	return s.parkUnreadable(qctx, rec, err, raw, lsn)
}

// parkUnreadable keeps a WAL message that cannot become a message as a
// quarantined row whose last_error holds its content. A table without
// idem's columns gets it logged with its content instead. It fails only
// when the database does.
func (s *session) parkUnreadable(ctx context.Context, rec driver.OutboxRecord, reason error, raw []byte, lsn pglogrepl.LSN) error {
	r := s.r
	lastError := fmt.Sprintf("a WAL message (lsn %s) that cannot become a message: %v; its content, quoted: %s", lsn, reason, strconv.Quote(string(raw)))
	tag, err := r.pool.Exec(ctx, r.sql.parkUnreadable, rec.AggregateType, rec.AggregateID, rec.Type, lastError)
	switch {
	case err == nil && tag.RowsAffected() == 1:
		r.eng.C.Quarantined.Add(1)
		r.log.Error("quarantined a WAL message of the outbox that cannot be published, as a row holding its content (idem failed list --relay)",
			"lsn", lsn.String(), "error", reason, "content", logengine.Quote(raw))
	case err != nil && !permanent(err):
		return fmt.Errorf("idem: cdc: quarantine what cannot be published: %w", err)
	default:
		r.log.Error("a WAL message of the outbox cannot be published, nor quarantined (a table without idem's columns); skipped: write it again with a fixed content",
			"lsn", lsn.String(), "error", reason, "content", logengine.Quote(raw), "quarantine_error", err)
	}
	return nil
}

// permanent reports whether a statement failed for good (the table lacks a
// column, a value does not fit): retrying would not help.
func permanent(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "42") || strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23"))
}

// quarantinedInsert reports whether an inserted row is quarantined already:
// a message the relay set aside (Config.QuarantineAfter) writes one.
func quarantinedInsert(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) bool {
	if tuple == nil {
		return false
	}
	for i, c := range rel.Columns {
		if c.Name == "quarantined_at" && i < len(tuple.Columns) {
			t := tuple.Columns[i].DataType
			return t == pglogrepl.TupleDataTypeText || t == pglogrepl.TupleDataTypeBinary
		}
	}
	return false
}

// delayedInsert reports whether an inserted row is delayed: its not_before
// is set (idem.Event.NotBefore).
func delayedInsert(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) bool {
	if tuple == nil {
		return false
	}
	for i, c := range rel.Columns {
		if c.Name == "not_before" && i < len(tuple.Columns) {
			t := tuple.Columns[i].DataType
			return t == pglogrepl.TupleDataTypeText || t == pglogrepl.TupleDataTypeBinary
		}
	}
	return false
}

// decodeTuple reads an inserted row with the postgres dialect's rules.
func decodeTuple(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) (driver.OutboxRecord, error) {
	if tuple == nil {
		return driver.OutboxRecord{}, errors.New("idem: cdc: insert without tuple")
	}
	idx := make(map[string]int, len(rel.Columns))
	for i, c := range rel.Columns {
		idx[c.Name] = i
	}
	rec, err := outboxcodec.DecodeText(func(col string) ([]byte, bool) {
		i, ok := idx[col]
		if !ok || i >= len(tuple.Columns) {
			return nil, false
		}
		c := tuple.Columns[i]
		if c.DataType != pglogrepl.TupleDataTypeText && c.DataType != pglogrepl.TupleDataTypeBinary {
			return nil, true // NULL (an insert has no unchanged TOAST value)
		}
		return c.Data, true
	})
	if err != nil {
		return rec, fmt.Errorf("idem: cdc: decode an outbox insert: %w", err)
	}
	return rec, nil
}

// serverGoing reports whether err says that the server is shutting down or
// the connection is gone (SQLSTATE classes 57 and 08, a failed connection).
func serverGoing(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "57") || strings.HasPrefix(pgErr.Code, "08")
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || pgconn.SafeToRetry(err)
}

// archiveEach archives recs one at a time, in order, after a batch failed
// on a value the database refuses (dataError): an event whose own values
// are refused (an id or an aggregate with a NUL character, from a WAL
// message) is left out of the archive, logged at error level with its
// content, rather than hold the slot's position for good. It returns how
// many it archived, and fails when the database does.
func (r *source) archiveEach(ctx context.Context, recs []*driver.OutboxRecord) (int64, error) {
	var n int64
	for _, rec := range recs {
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		var archived int64
		args := append([]any{[]string{}}, archiveArgs([]*driver.OutboxRecord{rec})...)
		err := r.pool.QueryRow(qctx, r.sql.archiveRows, args...).Scan(new(int64), &archived)
		cancel()
		switch {
		case err == nil:
			n += archived
		case dataError(err):
			r.log.Error("a published event cannot be archived: the database refuses one of its values; it was published, and idem replay will not find it",
				"id", rec.RawID, "aggregate_type", logengine.Quote([]byte(rec.AggregateType)), "aggregate_id", logengine.Quote([]byte(rec.AggregateID)),
				"type", logengine.Quote([]byte(rec.Type)), "payload", logengine.Quote(rec.Payload), "headers", logengine.Quote(rec.RawHeaders), "error", err)
		default:
			return n, err
		}
	}
	return n, nil
}

// dataError reports whether a statement failed on a value (SQLSTATE class
// 22: a character the encoding refuses, invalid JSON, a value out of
// range): trying it again as it is cannot help.
func dataError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22")
}

// firstInvisibleSQL returns the position (from 1) of the first of the
// given transactions that has not ended for a snapshot taken now, 0 when
// all have. The ids are the 32-bit ones of the log; each is widened to a
// 64-bit one with the epoch of the snapshot's xmax: a transaction the log
// sent was assigned its id before xmax.
const firstInvisibleSQL = `SELECT coalesce(min(i) FILTER (WHERE NOT pg_visible_in_snapshot((
	((pg_snapshot_xmax(s)::text::bigint >> 32) - (x >= (pg_snapshot_xmax(s)::text::bigint & 4294967295))::int) << 32 | x
	)::text::xid8, s)), 0)
FROM pg_current_snapshot() AS s, unnest($1::bigint[]) WITH ORDINALITY AS u(x, i)`

// firstInvisible returns the position (from 1) of the first of xids, which
// the log sent as committed, that other sessions do not see yet, or 0 when
// they see them all.
func (r *source) firstInvisible(ctx context.Context, xids []uint32) (int, error) {
	var n int64
	if err := r.pool.QueryRow(ctx, firstInvisibleSQL, xidArg(xids)).Scan(&n); err != nil {
		return 0, fmt.Errorf("idem: cdc: check that committed transactions are visible: %w", err)
	}
	return int(n), nil
}

// waitVisible waits until the transactions xids, which the log sent as
// committed, are visible to new snapshots.
func (r *source) waitVisible(ctx context.Context, xids []uint32) error {
	for waits := 1; ; waits++ {
		n, err := r.firstInvisible(ctx, xids)
		if err != nil || n == 0 {
			return err
		}
		if !ctxsleep.Sleep(ctx, backoff.Doubled(logengine.VisibleWaitMin, logengine.VisibleWaitMax, waits)) {
			return fmt.Errorf("idem: cdc: transactions %v are committed in the log and still not visible: %w", xids, ctx.Err())
		}
	}
}

func xidArg(xids []uint32) []int64 {
	arg := make([]int64, len(xids))
	for i, x := range xids {
		arg[i] = int64(x)
	}
	return arg
}

// Monitor reads the slot's lag every StandbyInterval and warns when the
// slot retains more WAL than LagWarnBytes.
func (r *source) Monitor(rctx context.Context, stopping <-chan struct{}) {
	warned := false
	for {
		ctx, cancel := context.WithTimeout(rctx, r.cfg.QueryTimeout)
		var lag, retained int64
		err := r.pool.QueryRow(ctx, slotPositionSQL, r.cfg.Slot).Scan(&lag, &retained)
		cancel()
		if err == nil {
			r.eng.C.LagBytes.Store(lag)
			r.eng.C.Retained.Store(retained)
			if r.cfg.LagWarnBytes > 0 && retained > r.cfg.LagWarnBytes {
				if !warned {
					r.log.Warn("the replication slot retains more WAL than LagWarnBytes: the relay is behind, or stopped; a slot no relay reads fills the disk (max_slot_wal_keep_size bounds it; idem cdc drop-slot retires it)",
						"retained_bytes", retained, "lag_bytes", lag, "warn_bytes", r.cfg.LagWarnBytes)
				}
				warned = true
			} else {
				warned = false
			}
		} else if rctx.Err() == nil {
			r.log.Debug("read the slot's lag", "error", err)
		}
		t := time.NewTimer(r.cfg.StandbyInterval)
		select {
		case <-t.C:
		case <-stopping:
			t.Stop()
			return
		}
	}
}

// FirstInvisible returns the position (from 1) of the first transaction of
// marks (their xids) that other sessions do not see yet, 0 when they see
// them all.
func (s *session) FirstInvisible(ctx context.Context, marks []any) (int, error) {
	xids := make([]uint32, len(marks))
	for i, m := range marks {
		xids[i] = m.(uint32)
	}
	return s.r.firstInvisible(ctx, xids)
}

// Confirm confirms the position to the server: c.Pos, or, when nothing read
// waits, the server's last position. A forced update (every
// StandbyInterval, at a stop, or asked by the server) asks for a reply:
// the server's keepalive tells that it is alive (Read).
func (s *session) Confirm(ctx context.Context, c logengine.Confirm) (bool, error) {
	r := s.r
	pos := s.flushed
	if c.Pos != nil {
		pos = max(pos, c.Pos.(pglogrepl.LSN))
	}
	if c.Idle && s.tx == nil && s.walEnd > pos {
		// Nothing read waits: everything the server sent is done.
		pos = s.walEnd
	}
	moved := pos > s.flushed
	// A status update is due every StandbyInterval, also while the window
	// is full and nothing is read.
	force := c.Force || time.Since(s.lastStatus) >= r.cfg.StandbyInterval
	if !moved && !force {
		return true, nil
	}
	if moved && c.Pos != nil && fault.Enabled {
		fault.Point(fault.CDCAfterPublishBeforeConfirm)
	}
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos, ReplyRequested: force})
	if err != nil {
		return false, fmt.Errorf("idem: cdc: standby status update: %w", err)
	}
	s.lastStatus = time.Now()
	if moved {
		s.flushed = pos
		r.eng.C.ConfirmedLSN.Store(uint64(pos))
		p := pos.String()
		r.eng.C.Position.Store(&p)
		if c.Pos != nil && fault.Enabled {
			fault.Point(fault.CDCAfterConfirm)
		}
	}
	return true, nil
}

// Gone reports whether err says that the server is shutting down or the
// connection is gone.
func (r *source) Gone(err error) bool { return serverGoing(err) }
