// Package mysql is idem's MySQL and MariaDB dialect, for database/sql with
// github.com/go-sql-driver/mysql. It needs MySQL 8.0.13 or later (8.0.19
// for the down migration of 0010), or MariaDB 10.6 or later (FOR UPDATE
// SKIP LOCKED, expression defaults), and sends one SQL to both. It is
// tested on MariaDB; its statements were checked against MySQL 8.0's and
// 8.4's grammar (docs/ARCHITECTURE.md, "MySQL 8 compatibility"), and a
// test refuses the constructs only MariaDB accepts.
//
// A tour:
//
//	db, err := mysql.Open("mysql://app:secret@localhost:3306/shop") // or a go-sql-driver DSN
//	drv := mysql.New(db)                     // a driver.Driver[*sql.Tx]
//	_, err = migrate.New(drv).Up(ctx)        // outbox, processed_event, failed_message
//	w := outbox.NewWriter(drv)               // write events in your *sql.Tx
//	c, err := inbox.New(drv, inbox.Config{Name: "stock"})
//
// Tables are InnoDB, utf8mb4 with the collation utf8mb4_bin named (PAD
// SPACE and exact on both servers, where MySQL 8's default is NO PAD and
// case-insensitive), with DATETIME(6) timestamps in UTC; event ids
// are CHAR(36) UUID text, but for the outbox's id, VARCHAR(64) since
// migration 0010: another program may write ids that are not UUIDs, which
// the relay publishes under the UUID idem.EventID derives. Tables.Schema
// names the database holding them.
//
// Deduplication inserts the (consumer_name, event_id) marker and recognises
// the duplicate-key error 1062 on the processed_event primary key only
// (IsDuplicateKey): a duplicate on any other key, for example a handler's own
// unique index, stays an error. The error does not abort the InnoDB
// transaction. A second worker inserting the same marker waits for the first
// one's transaction, then sees the duplicate if it committed.
//
// MySQL DDL commits implicitly, so migrations are not transactional: the
// migrator takes a GET_LOCK session lock, runs each statement on its own and
// records each version right after its migration.
//
// The polling relay claims rows with FOR UPDATE SKIP LOCKED after locking
// the single row of <outbox>_claim_lock, so claims run one after the other.
// There is no LISTEN/NOTIFY: relays poll at a short, jittered interval. The
// binlog (Debezium) can read the same outbox.
package mysql
