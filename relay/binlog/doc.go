// Package binlog is the change-data-capture relay for MariaDB and MySQL 8:
// it reads the outbox from the server's binary log, as a replica does, instead of
// polling the table, and publishes through the same broker.Publisher as
// the other relays (packages relay and relay/cdc). "idem cdc" runs it for a
// mysql:// URL.
//
//	r, err := binlog.New(os.Getenv("IDEM_DB_URL"), pub, binlog.Config{})
//	if err != nil { ... }
//	if err := r.Start(ctx); err != nil { ... } // settings, privileges, tables
//	defer r.Stop(context.Background())
//
// What it reads. The inserts into the outbox table (Debezium's five
// columns id, aggregatetype, aggregateid, type, payload, and idem's), read
// with the polling relay's rules: a row written by another program becomes
// the same message whichever relay reads it. A payload that is not JSON
// (idem.Event.ContentType) is read from payload_binary. Deletes are not
// published, nor updates, except the one that takes a row out of
// quarantine ("idem failed retry --relay"), whose row is published again.
// Rolled-back transactions are not in the binlog; rows of other tables are
// skipped. An insert a writer's session logged as a statement
// (binlog_format STATEMENT or MIXED in that session) holds no row to read:
// the relay logs it at error level and counts it (Stats.Unreadable), and
// the row stays in the table.
//
// Column names. Rows events give values by position. With
// binlog_row_metadata = FULL each table map names its columns, and the
// relay reads them there. With MariaDB's default, NO_LOG (or MINIMAL), it
// reads them from information_schema, with their signedness, at the first
// outbox row and again after each DDL statement on the outbox the binlog
// shows, and checks every table map against them (number, order, types,
// lengths, nullability). Rows logged before an ALTER TABLE that the relay
// reads after it (it was stopped, or behind, when it read the columns)
// do not fit: the relay publishes nothing under a wrong name
// (ErrColumnsChanged). On an outbox with idem's columns and
// Config.Delete = DeletePublished it publishes the rows waiting in the
// table instead, as at a first start, and reads on from that snapshot;
// otherwise it stops there, says what to do, and tries again. A change
// that keeps every column's type and place (a column renamed, two columns
// of one type swapped) cannot be seen without the names: make such
// changes while the relay runs and has read the binlog before them, or set
// binlog_row_metadata = FULL. Start logs which way it reads the names.
//
// The server. MariaDB 10.5 or later, or MySQL 8.0 or later (below). Of
// MariaDB's defaults two must change: log_bin (off: the binlog
// is needed) and binlog_format (MIXED: MariaDB logs an INSERT of plain
// values as a statement, which holds no row, so a table with Debezium's
// columns would lose events; idem's table, whose defaults call
// UTC_TIMESTAMP, happens to be logged as rows, a rule of MariaDB's that
// the relay does not rest on) must be ROW. The other defaults work:
// binlog_row_image = FULL (a MINIMAL or NOBLOB image leaves columns out),
// binlog_row_metadata = NO_LOG (above), log_bin_compress = OFF (compressed
// events are not read), binlog_checksum = CRC32 (checked). The relay
// presents a server_id of its own (Config.ServerID, derived from the
// database and table by default), which must differ from every server's
// and replica's. Its user needs REPLICATION SLAVE and REPLICATION CLIENT
// (BINLOG MONITOR) on *.*, and SELECT, INSERT, UPDATE, DELETE on the
// outbox's database; the URL's user and address serve the replication
// connection too (see New). Start checks each setting and privilege and
// names the one missing and how to set it (ErrServerSettings,
// ErrPrivileges); "idem migrate" creates the position table (migration
// 0011, Config.Tables.BinlogPosition).
//
// MySQL 8. The relay reads by GTID: gtid_mode = ON and
// enforce_gtid_consistency = ON (OFF by default) must be set; MySQL's
// other defaults work (binlog_format ROW, binlog_row_image FULL,
// binlog_row_metadata MINIMAL, binlog_row_value_options empty, not
// PARTIAL_JSON; binlog_transaction_compression either way). The position
// is a GTID set; the user may have caching_sha2_password, MySQL 8's
// default. JSON columns are decoded to their text. The first start reads
// gtid_executed, then opens its snapshot: a transaction committed between
// the two is published twice, none is lost (see snapshotMySQL). Start
// checks a stored position against gtid_purged and gtid_executed. This
// path is tested against an implementation of MySQL's protocol
// (internal/mysql8test), not a MySQL server.
//
// Order and position. Transactions arrive in commit order. Their messages
// go through the ordered publisher of the other relays: several Publish
// calls at once (Config.Window), never two of one aggregate at once, a
// failed or refused publish retried with backoff before its aggregate goes
// on. MariaDB sends a transaction to replicas a moment before the storage
// engine commits it: a locking read of one of its rows waits for that
// commit before its messages are published. The GTID position after the
// last transaction whose messages, and every one before them, the broker
// confirmed is stored in the position table, after the published rows are
// deleted (Config.Delete) and archived (Config.ArchiveRetention, the table
// "outbox_archive" of migration 0013, which relay.Replay reads): a restart
// resumes there, and a crash publishes again at most what came after it
// (at least once; consumers deduplicate), skipping nothing.
//
// First start. With no stored position the relay takes a consistent
// snapshot for an instant: its binlog position and the highest seq waiting
// in it. It publishes the rows waiting up to that seq in seq order, a page
// at a time (deleting each page) and outside any transaction, so that an
// ALTER TABLE of the outbox meanwhile waits for no lock of the relay's;
// it stores the snapshot's position once they are all published, and
// reads the binlog from exactly there. A stop
// or a crash before the end leaves the position unstored: the next start
// takes a new snapshot, which holds the rows not yet deleted. That needs
// idem's seq, published_at and quarantined_at columns and
// Config.Delete = DeletePublished; otherwise the relay starts from the
// server's current position and warns about the rows the table holds.
//
// Retention. Unlike a PostgreSQL slot, MariaDB (or MySQL) keeps no binlog for a reader
// that is away: it purges files after binlog_expire_logs_seconds whether
// the relay read them or not. A relay whose stored position was purged
// does not start (ErrPositionPurged); ResetPosition ("idem cdc
// reset-position") forgets the position, and the next start publishes the
// rows still waiting in the table, then reads on from the server's current
// position.
//
// One reader per outbox. A named lock (GET_LOCK on a connection held for
// the relay's life) lets one relay read an outbox: a second one waits
// (Stats.Waiting, Healthy nil) and takes over within Config.StandbyPoll
// when the first stops or dies, its connection and lock ending with it.
//
// Unreadable rows, refused messages and delayed rows are handled as by
// relay/cdc: a row that cannot become a message is quarantined in place
// (a table without idem's columns: logged at error level with its
// content), a message the broker refuses Config.QuarantineAfter times is
// quarantined, and a row whose not_before is set waits in the table, where
// the relay that holds the outbox publishes it once due
// (Config.DueInterval). Stats, which relay/cdc/cdcmetrics exports, report
// what it does; Healthy says whether it reads the binlog.
//
// All of that, but reading the binlog, the first start's snapshot, the
// visibility check, the stored position and the outbox's lock, is the
// engine every log relay shares (relay/internal/logengine), as
// relay/cdc's is.
package binlog
