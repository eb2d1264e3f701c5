-- The archive of the events the binlog relay published ("idem cdc" on
-- MariaDB, relay/binlog, with its archive on): that relay leaves no
-- published row in the outbox (it deletes its rows, or leaves them to their
-- writer unmarked), so "idem replay" reads the period here. One table for
-- every outbox of the database, as binlog_position: outbox_table names the
-- event's outbox, so that an outbox idem did not create (another
-- program's, with Debezium's columns) has its archive too. The relay
-- writes the events of each confirmed batch in the transaction that
-- deletes their rows, in the order it published them (seq, the clustered
-- key: the inserts append), and deletes those published longer ago than
-- its retention. An event written twice (a crash between that transaction
-- and the storing of the position: the binlog gives the transaction again)
-- is kept once, by its id. Timestamps are UTC.
CREATE TABLE {{.OutboxArchive}} (
    seq               BIGINT       NOT NULL AUTO_INCREMENT,
    outbox_table      VARCHAR(64)  NOT NULL,
    id                VARCHAR(64)  NOT NULL,
    aggregatetype     VARCHAR(255) NOT NULL,
    aggregateid       VARCHAR(255) NOT NULL,
    type              VARCHAR(255) NOT NULL,
    payload           JSON         NULL,
    occurred_at       DATETIME(6)  NOT NULL,
    aggregate_version BIGINT       NOT NULL DEFAULT 0,
    headers           JSON         NOT NULL DEFAULT ('{}'),
    published_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (seq),
    UNIQUE KEY {{ident .OutboxArchiveName "id_key"}} (outbox_table, id),
    KEY {{ident .OutboxArchiveName "occurred_at_idx"}} (outbox_table, occurred_at),
    KEY {{ident .OutboxArchiveName "published_at_idx"}} (outbox_table, published_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
