// Package cdc is the change-data-capture relay for PostgreSQL: it reads the
// outbox from the write-ahead log through logical replication (the built-in
// pgoutput plugin, no extension to install) instead of polling the table,
// and publishes through the same broker.Publisher as the polling relay
// (package relay).
//
//	r, err := cdc.New("postgres://idem@db/shop", pub, cdc.Config{})
//	if err != nil { ... }
//	if err := r.Start(ctx); err != nil { ... } // wal_level, publication, slot
//	defer r.Stop(context.Background())
//
// What it reads. The inserts into the outbox table (Debezium's five
// columns id, aggregatetype, aggregateid, type, payload, and idem's), read
// with the polling relay's rules: a row written by another program becomes
// the same message whichever relay reads it. And the transactional WAL messages of
// outbox.NewLogWriter (pg_logical_emit_message(true, prefix, event)), an
// outbox with no table, published exactly as rows. A payload that is not
// JSON (idem.Event.ContentType, migration 0014) is read from the bytea
// column payload_binary (pgoutput's hex text) or from a WAL message's
// payload_base64, and published with its content type; the archive keeps
// it as it is. Updates, deletes and
// truncates are not published; rows of other tables in the publication and
// messages with other prefixes are ignored; a non-transactional message with
// the outbox's prefix is ignored with a warning (it is tied to no commit).
//
// Order and confirmation. Transactions arrive in commit order. Messages are
// published in that order through several Publish calls at once (a window
// of Config.Window messages), never two of one aggregate at once: a message
// goes only after the previous one of its aggregate was confirmed. A failed
// or refused publish is retried, with backoff, before its aggregate goes on;
// a broker away for minutes costs time only. The slot's confirmed position
// moves to a transaction's commit only once the broker confirmed that
// transaction's messages and every one before them, the published rows
// were deleted (Config.Delete) and the messages archived
// (Config.ArchiveRetention): after a crash, the server sends again what
// was not confirmed (at least once; consumers deduplicate).
//
// The archive. This relay leaves no published row in the outbox (it
// deletes its rows, or leaves them unmarked to their writer with KeepRows,
// and a WAL message is no row at all), so relay.Replay ("idem replay")
// reads what it published from the archive, the table "outbox_archive" of
// migration 0013 (Config.Tables.OutboxArchive): each confirmed batch of messages,
// rows and WAL messages alike, is written there in the order of
// publication, in the statement that deletes the batch's rows, before the
// position is confirmed. A crash in between gives the transactions again;
// the archive keeps each event once, by its id. Events archived longer ago
// than Config.ArchiveRetention (7 days) are deleted every
// Config.ArchivePurgeInterval; a negative retention turns the archive off.
//
// Rows waiting when the slot is created. A slot streams what commits after
// its creation only. The relay creates it with an exported snapshot, reads
// in it the highest seq of the rows waiting in the table (published_at and
// quarantined_at empty: rows written before the first start, a table the
// polling relay served), then publishes the rows waiting up to that seq in
// seq order and deletes them before reading the stream. It reads them
// outside any transaction: an ALTER TABLE of the outbox meanwhile waits for
// no lock of the relay's, and stops no writer. It needs idem's seq, published_at and quarantined_at columns and
// Config.Delete = DeletePublished; a stop or crash before the end leaves the
// rest in the table (drop the slot and start again).
//
// Unreadable input. A row that cannot become a message (an id that is not a
// UUID, headers that are not a JSON object, no event name, a payload that is
// not JSON) is quarantined in the table as the polling relay does
// (quarantined_at, last_error: "idem failed list --relay" shows it) and the
// relay goes on; a WAL message that cannot become a message is kept as a
// quarantined row whose last_error holds its whole content; a row it cannot
// quarantine (deleted meanwhile by its writer, or a table without idem's
// columns) is logged at error level with its whole content. Unlike the
// polling relay's, a quarantined row does not hold the later rows of its
// aggregate: the log goes on. To publish a fixed row again, insert it again
// (the CDC relay reads inserts only).
//
// Refused messages. A message the broker refuses itself (unroutable,
// nacked, too large) is retried with backoff, its aggregate waiting, and
// quarantined after Config.QuarantineAfter refusals: its row gets
// quarantined_at and last_error, a WAL message (or a row its writer deleted)
// is written into the outbox as a quarantined row, and the position goes on.
// The PostgreSQL dialect's RequeueQuarantined ("idem failed retry --relay")
// writes a quarantined row again, which this relay reads as an insert and
// publishes; inserts that are quarantined already are skipped. Faults (no
// answer from the broker) are retried for as long as they last.
//
// Delayed rows. A row whose not_before is set (idem.Event.NotBefore,
// migration 0012) is held: the stream skips its insert and its position
// moves on, the row waits in the table, and the relay that reads the slot
// looks every Config.DueInterval (1s) for the delayed rows due by
// Config.Now, publishes them through the same ordered publisher (refused
// ones quarantined after Config.QuarantineAfter), then deletes them (with
// KeepRows, sets their published_at). A crash or a stop before the delete
// leaves the row in the table, published by the next relay (again, if it
// was published already: consumers deduplicate); the first start's sweep
// leaves delayed rows to the same scan. A delayed row holds back nothing of
// its aggregate, as with the polling relay. A writer that deletes its rows
// itself (KeepRows, Debezium's insert then delete) cannot delay events:
// the row must stay until it is published. WAL messages cannot be delayed
// (outbox.NewLogWriter refuses such events).
//
// Failover. Before PostgreSQL 17 a standby has no copy of the logical
// slot. On a multi-host URL (target_session_attrs=read-write) the relay
// reaches the promoted standby, finds its slot missing, creates it again and
// publishes the rows still in the table first, as at the first start (some
// a second time). Events that exist only in the WAL (WAL messages, rows
// deleted by their writer or kept with KeepRows) and were not published
// are lost with the slot: on a server with a physical standby, Start
// refuses (ErrFailoverLoss) unless Config.RowsOnly says every event is a
// row the relay deletes, or Config.AcceptFailoverLoss accepts the loss.
// From PostgreSQL 17 on the slot is created with failover, for standbys
// that synchronize slots (sync_replication_slots), and neither is needed.
//
// One reader per slot. PostgreSQL lets one connection read a slot: a second
// relay on the same slot waits (Stats.Waiting, Healthy nil) and takes over
// within a second or two when the first stops or dies.
//
// The server. wal_level = logical; the relay's role needs the REPLICATION
// attribute. The relay creates the publication (for inserts into the outbox
// only; that needs the ownership of the table, or a DBA creates it
// beforehand with the statement the error gives) and the slot (named
// idem_<schema>_<table> by default) when they do not exist. A slot keeps the
// WAL from its confirmed position on, even when no relay reads it: bound it
// with max_slot_wal_keep_size, watch the lag (Stats, the cdcmetrics
// collector, the warning above Config.LagWarnBytes) and drop the slot when
// retiring a relay (DropSlot, "idem cdc drop-slot").
//
// The engine. Reading the slot, the snapshot of its creation, the
// visibility check, the confirmation to the server and the SQL on the
// outbox are this package's; the rest (pipeline, window, ordered
// publishing, delayed rows, quarantine, archive, lifecycle, Stats) is the
// engine every log relay shares (relay/internal/logengine), as
// relay/binlog's is.
package cdc
