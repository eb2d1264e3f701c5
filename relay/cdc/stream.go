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
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/outboxcodec"
)

// run reads the slot until Stop, reconnecting after failures with capped
// backoff; while another process holds the slot it waits.
func (r *Relay) run() {
	defer r.dropInitial()
	failures := 0
	stopping := r.base.Stopping()
	for {
		select {
		case <-stopping:
			return
		default:
		}
		if r.initial != nil {
			r.publishInitial()
		}
		read, err := r.session()
		select {
		case <-stopping:
			return
		default:
		}
		if errors.Is(err, idem.ErrNotFound) {
			// The slot is gone: a failover to a standby without a copy of
			// it (PostgreSQL before 17), or a drop.
			if err = r.recreateSlot(err); err == nil {
				failures = 0
				continue
			}
		}
		if read {
			failures = 0
		}
		failures++
		var d time.Duration
		if errors.Is(err, ErrSlotActive) {
			if !r.stats.waiting.Swap(true) {
				r.log.Info("another process reads the slot; waiting to take over", "error", err)
			}
			d = jitter(min(time.Second, r.cfg.MaxRetryBackoff))
		} else {
			r.stats.waiting.Store(false)
			r.setErr(err)
			d = r.backoff(failures)
			r.errs.replication.Warn(r.ctx, "replication stopped; reconnecting", err, "retry_in", d.Round(time.Millisecond))
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

// txState is the transaction being read.
type txState struct {
	xid     uint32
	commit  time.Time
	entries []*entry
}

// session is one replication connection: it reads until Stop or an error.
// read reports whether it read from the slot at all.
func (r *Relay) session() (read bool, err error) {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, r.replCfg)
	if err != nil {
		return false, replicationErrorOn(r.host, err, r.replCfg.User)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names '" + r.cfg.Publication + "'",
			"messages 'true'",
		},
	})
	if err != nil {
		return false, slotErrorOn(r.host, err, r.cfg.Slot, r.replCfg.User)
	}
	if r.stats.waiting.Swap(false) {
		r.log.Info("took the slot over")
	}
	r.stats.streaming.Store(true)
	defer r.stats.streaming.Store(false)
	if r.sql.due != "" {
		// Delayed rows are published from the table by the relay that
		// holds the slot, and by it only.
		dueCtx, stopDue := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.dueLoop(dueCtx) }()
		defer func() { stopDue(); <-done }()
	}
	r.setErr(nil)
	r.errs.replication.OK(ctx)
	r.log.Debug("replication started")

	s := &session{r: r, conn: conn, pipe: newPipeline(ctx, r), relations: map[uint32]*pglogrepl.RelationMessage{}, heard: time.Now()}
	defer func() {
		cancel()
		s.pipe.wait()
		r.stats.inFlight.Store(0)
		r.stats.oldest.Store(0)
	}()
	return true, s.loop(ctx)
}

// session is the state of one replication connection.
type session struct {
	r         *Relay
	conn      *pgconn.PgConn
	pipe      *pipeline
	relations map[uint32]*pglogrepl.RelationMessage
	tx        *txState

	flushed  pglogrepl.LSN // confirmed to the server
	walEnd   pglogrepl.LSN // the server's position in its last keepalive
	toDelete []string
	// toArchive holds the events published and not archived yet
	// (Config.ArchiveRetention), in log order.
	toArchive []*driver.OutboxRecord
	ready     pglogrepl.LSN // published, its rows deleted and its events archived: to confirm
	// deleteFailures counts the failed deletes in a row; none is tried
	// before deleteAfter.
	deleteFailures int
	deleteAfter    time.Time
	lastStatus     time.Time
	// heard is when the server's last message was read, moved forward by
	// the time the relay did not read (its window full): silenceLimit.
	heard time.Time
}

// silenceLimit is how long a server may send nothing, while the relay
// waits for it and asks it for a reply every standbyInterval, before the
// connection is taken for dead: three intervals, at least 10 s.
func silenceLimit(standbyInterval time.Duration) time.Duration {
	return max(3*standbyInterval, 10*time.Second)
}

func (s *session) loop(ctx context.Context) error {
	r := s.r
	stopping := r.base.Stopping()
	nextFlush := time.Now().Add(r.cfg.FlushInterval)
	for {
		select {
		case <-stopping:
			return s.drain(ctx)
		default:
		}
		now := time.Now()
		if !now.Before(nextFlush) {
			if err := s.flush(ctx, false); err != nil {
				return err
			}
			nextFlush = now.Add(r.cfg.FlushInterval)
		}
		deadline := nextFlush
		if standby := s.lastStatus.Add(r.cfg.StandbyInterval); standby.Before(deadline) {
			deadline = standby
		}
		if deadline.Before(nextFlush) && !now.Before(deadline) {
			if err := s.flush(ctx, true); err != nil {
				return err
			}
			continue
		}
		if s.pipe.full() {
			waited := time.Now()
			t := time.NewTimer(time.Until(deadline))
			select {
			case <-s.pipe.progress:
			case <-t.C:
			case <-stopping:
			case <-ctx.Done():
			}
			t.Stop()
			// The server's messages wait unread meanwhile: not a silence.
			s.heard = s.heard.Add(time.Since(waited))
			continue
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
					return fmt.Errorf("idem: cdc: the server answered nothing for %v though asked to every %v: the connection is taken for dead (a frozen or unreachable server; the URL's hosts are tried again)",
						silent.Round(time.Second), r.cfg.StandbyInterval)
				}
				continue
			}
			return fmt.Errorf("idem: cdc: receive: %w", err)
		}
		s.heard = time.Now()
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.copyData(ctx, m.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("idem: cdc: server: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return errors.New("idem: cdc: the server ended the replication")
		}
	}
}

// drain ends a session on Stop: the messages handed to the broker are
// confirmed (or abandoned with the relay's context), the rows deleted and
// the position confirmed.
func (s *session) drain(ctx context.Context) error {
	if !s.pipe.drainWait(ctx) {
		return nil
	}
	return s.flush(ctx, true)
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
		if k.ReplyRequested {
			return s.flush(ctx, true)
		}
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
			// It waits in the table for its time: publishDue publishes it
			// then, and deletes it. The stream's position moves on.
			r.stats.held.Add(1)
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
			r.stats.unreadable.Add(1)
			r.log.Warn("ignored a non-transactional WAL message with the outbox's prefix: it is not tied to a commit (outbox.NewLogWriter writes transactional ones)",
				"lsn", m.LSN.String(), "content", quote(m.Content))
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
		if len(tx.entries) > 0 {
			r.stats.txs.Add(1)
			if fault.Enabled {
				fault.Point(fault.CDCAfterReceive)
			}
			tx.entries[len(tx.entries)-1].lsn = m.TransactionEndLSN
			s.pipe.add(tx.entries)
		} else {
			s.pipe.add([]*entry{{lsn: m.TransactionEndLSN, commit: tx.commit}})
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
	msg, err := outboxcodec.Message(rec)
	if err == nil {
		e := &entry{msg: msg, hasMsg: true, key: rec.AggregateType + "\x00" + rec.AggregateID, xid: s.tx.xid, commit: s.tx.commit, rec: &rec, wal: !row}
		if row && r.cfg.Delete == DeletePublished {
			e.id = rec.RawID
		}
		s.tx.entries = append(s.tx.entries, e)
		return nil
	}
	r.stats.unreadable.Add(1)
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	if row {
		return s.quarantineRow(qctx, rec, err)
	}
	return s.parkUnreadable(qctx, rec, err, raw, lsn)
}

// quarantineRow quarantines an inserted row that cannot become a message,
// in place. A row the writer deleted meanwhile, or a table without idem's
// columns, is logged with its content instead. It fails only when the
// database does.
func (s *session) quarantineRow(ctx context.Context, rec driver.OutboxRecord, reason error) error {
	r := s.r
	// The row's transaction is in the log before other sessions see it.
	err := r.waitVisible(ctx, []uint32{s.tx.xid})
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = r.pool.Exec(ctx, r.sql.quarantine, rec.Seq, reason.Error())
	}
	switch {
	case err == nil && tag.RowsAffected() == 1:
		r.stats.quarantined.Add(1)
		r.log.Error("quarantined an outbox row that cannot be published (idem failed list --relay)",
			"seq", rec.Seq, "id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "error", reason)
	case err != nil && !permanent(err):
		return fmt.Errorf("idem: cdc: quarantine what cannot be published: %w", err)
	default:
		r.log.Error("an outbox row cannot be published, nor quarantined (deleted since, or a table without idem's columns); skipped",
			"seq", rec.Seq, "id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID,
			"type", rec.Type, "payload", quote(rec.Payload), "headers", quote(rec.RawHeaders), "error", reason, "quarantine_error", err)
	}
	return nil
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
		r.stats.quarantined.Add(1)
		r.log.Error("quarantined a WAL message of the outbox that cannot be published, as a row holding its content (idem failed list --relay)",
			"lsn", lsn.String(), "error", reason, "content", quote(raw))
	case err != nil && !permanent(err):
		return fmt.Errorf("idem: cdc: quarantine what cannot be published: %w", err)
	default:
		r.log.Error("a WAL message of the outbox cannot be published, nor quarantined (a table without idem's columns); skipped: write it again with a fixed content",
			"lsn", lsn.String(), "error", reason, "content", quote(raw), "quarantine_error", err)
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

func quote(b []byte) string {
	if len(b) > 1000 {
		return strconv.Quote(string(b[:1000])) + "..."
	}
	return strconv.Quote(string(b))
}

// flush deletes the published rows, then confirms their position to the
// server. With force, a status update is sent even when the position did
// not move (the server asked, or StandbyInterval passed).
func (s *session) flush(ctx context.Context, force bool) error {
	r := s.r
	lsn, ids, archive, commits := s.pipe.confirmed()
	s.toDelete = append(s.toDelete, ids...)
	s.toArchive = append(s.toArchive, archive...)
	if lsn > s.ready {
		s.ready = lsn
	}
	pos := s.ready
	if len(s.toDelete) > 0 || len(s.toArchive) > 0 {
		err := errDeleteLater
		if !time.Now().Before(s.deleteAfter) {
			err = s.deleteRows(ctx)
		}
		switch {
		case err == nil:
			s.deleteFailures = 0
			r.errs.delete.OK(ctx)
		case serverGoing(err):
			// A server shutting down waits for its walsenders to see
			// everything they sent confirmed, and refuses the deletes the
			// position waits for: leave, and resume from the slot.
			return fmt.Errorf("idem: cdc: delete published rows: %w", err)
		default:
			// The position waits for the rows (s.ready stays): try again
			// after a backoff.
			if err != errDeleteLater {
				s.deleteFailures++
				d := r.backoff(s.deleteFailures)
				s.deleteAfter = time.Now().Add(d)
				r.errs.delete.Warn(ctx, "deleting published rows failed; their position waits", err, "rows", len(s.toDelete),
					"retry_in", d.Round(time.Millisecond))
			}
			pos = s.flushed
			lsn = 0
		}
	}
	if s.tx == nil && s.walEnd > pos && s.pipe.empty() && len(s.toDelete) == 0 && len(s.toArchive) == 0 {
		// Nothing read waits: everything the server sent is done.
		pos = s.walEnd
	}
	moved := pos > s.flushed
	if !moved && !force {
		return nil
	}
	if moved && lsn != 0 && fault.Enabled {
		fault.Point(fault.CDCAfterPublishBeforeConfirm)
	}
	// A forced update (every StandbyInterval, or asked by the server) asks
	// for a reply: the server's keepalive tells that it is alive (loop).
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: max(pos, s.flushed), ReplyRequested: force})
	if err != nil {
		return fmt.Errorf("idem: cdc: standby status update: %w", err)
	}
	s.lastStatus = time.Now()
	if moved {
		s.flushed = pos
		r.stats.confirmed.Store(uint64(pos))
		if lsn != 0 && fault.Enabled {
			fault.Point(fault.CDCAfterConfirm)
		}
		if r.cfg.Observer.Confirm != nil {
			for _, c := range commits {
				r.cfg.Observer.Confirm(s.lastStatus.Sub(c))
			}
		}
	}
	return nil
}

// errDeleteLater says that a delete waits for its backoff.
var errDeleteLater = errors.New("idem: cdc: delete waits for its backoff")

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

// deleteRows deletes the published rows and, when the relay archives what
// it publishes, archives the published events in the same statements:
// deleted and archived together, or neither. Their transactions are
// visible: nothing is published before (pipeline.watch).
func (s *session) deleteRows(ctx context.Context) error {
	r := s.r
	for len(s.toDelete) > 0 || len(s.toArchive) > 0 {
		n, m := min(len(s.toDelete), 1000), min(len(s.toArchive), 1000)
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		var deleted, archived int64
		var err error
		if m == 0 {
			var tag pgconn.CommandTag
			tag, err = r.pool.Exec(qctx, r.sql.deleteRows, s.toDelete[:n])
			deleted = tag.RowsAffected()
		} else {
			args := append([]any{s.toDelete[:n]}, archiveArgs(s.toArchive[:m])...)
			err = r.pool.QueryRow(qctx, r.sql.archiveRows, args...).Scan(&deleted, &archived)
		}
		cancel()
		if err != nil && m > 0 && dataError(err) {
			// An event the archive cannot hold: archive the others one by
			// one, then delete the rows.
			archived, err = r.archiveEach(ctx, s.toArchive[:m])
			if err == nil {
				qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
				var tag pgconn.CommandTag
				tag, err = r.pool.Exec(qctx, r.sql.deleteRows, s.toDelete[:n])
				cancel()
				deleted = tag.RowsAffected()
			}
		}
		if err != nil {
			return err
		}
		r.stats.deleted.Add(deleted)
		r.stats.archived.Add(archived)
		s.toDelete, s.toArchive = s.toDelete[n:], s.toArchive[m:]
	}
	s.toDelete, s.toArchive = nil, nil
	return nil
}

// archiveEach archives recs one at a time, in order, after a batch failed
// on a value the database refuses (dataError): an event whose own values
// are refused (an id or an aggregate with a NUL character, from a WAL
// message) is left out of the archive, logged at error level with its
// content, rather than hold the slot's position for good. It returns how
// many it archived, and fails when the database does.
func (r *Relay) archiveEach(ctx context.Context, recs []*driver.OutboxRecord) (int64, error) {
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
				"id", rec.RawID, "aggregate_type", quote([]byte(rec.AggregateType)), "aggregate_id", quote([]byte(rec.AggregateID)),
				"type", quote([]byte(rec.Type)), "payload", quote(rec.Payload), "headers", quote(rec.RawHeaders), "error", err)
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
func (r *Relay) firstInvisible(ctx context.Context, xids []uint32) (int, error) {
	var n int64
	if err := r.pool.QueryRow(ctx, firstInvisibleSQL, xidArg(xids)).Scan(&n); err != nil {
		return 0, fmt.Errorf("idem: cdc: check that committed transactions are visible: %w", err)
	}
	return int(n), nil
}

// waitVisible waits until the transactions xids, which the log sent as
// committed, are visible to new snapshots.
func (r *Relay) waitVisible(ctx context.Context, xids []uint32) error {
	for d := visibleWaitMin; ; d = min(2*d, visibleWaitMax) {
		n, err := r.firstInvisible(ctx, xids)
		if err != nil || n == 0 {
			return err
		}
		if !ctxsleep.Sleep(ctx, d) {
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

// monitor reads the slot's lag every StandbyInterval and warns when the
// slot retains more WAL than LagWarnBytes.
func (r *Relay) monitor() {
	stopping := r.base.Stopping()
	warned := false
	for {
		ctx, cancel := context.WithTimeout(r.ctx, r.cfg.QueryTimeout)
		var lag, retained int64
		err := r.pool.QueryRow(ctx, slotPositionSQL, r.cfg.Slot).Scan(&lag, &retained)
		cancel()
		if err == nil {
			r.stats.lagBytes.Store(lag)
			r.stats.retained.Store(retained)
			if r.cfg.LagWarnBytes > 0 && retained > r.cfg.LagWarnBytes {
				if !warned {
					r.log.Warn("the replication slot retains more WAL than LagWarnBytes: the relay is behind, or stopped; a slot no relay reads fills the disk (max_slot_wal_keep_size bounds it; idem cdc drop-slot retires it)",
						"retained_bytes", retained, "lag_bytes", lag, "warn_bytes", r.cfg.LagWarnBytes)
				}
				warned = true
			} else {
				warned = false
			}
		} else if r.ctx.Err() == nil {
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
