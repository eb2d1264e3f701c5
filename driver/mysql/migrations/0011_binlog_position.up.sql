-- The binlog relay's position (relay/binlog, "idem cdc" on MariaDB): one row
-- per outbox table, the GTID position up to which the broker confirmed
-- every event (and, with the default delete mode, their rows are deleted).
-- The relay writes it after each confirmed transaction batch; a restart
-- resumes from it. No row: the relay's first start publishes the rows
-- waiting in the outbox, then reads the binlog from the server's position.
CREATE TABLE {{.BinlogPosition}} (
    outbox_table VARCHAR(64)  NOT NULL,
    gtid_pos     TEXT         NOT NULL,
    binlog_file  VARCHAR(255) NOT NULL DEFAULT '',
    binlog_pos   BIGINT       NOT NULL DEFAULT 0,
    updated_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (outbox_table)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
