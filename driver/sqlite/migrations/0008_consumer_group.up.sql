-- Ownership groups of consumers (inbox.Group): the replicas of one consumer
-- share its partitions. Each replica is a member with a lease it renews
-- (its heartbeat); each partition has at most one owner at a time, under a
-- lease of its own, whose epoch counts its tenures. Leases are timed by
-- the database's clock only. Their names are Tables.ConsumerMember and
-- Tables.ConsumerPartition. Timestamps are UTC text,
-- 'YYYY-MM-DD HH:MM:SS.ffffff'.
CREATE TABLE {{.ConsumerMember}} (
    consumer_name TEXT NOT NULL,
    member_id     TEXT NOT NULL,
    lease_until   TEXT NOT NULL,
    joined_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (consumer_name, member_id)
) WITHOUT ROWID;
CREATE TABLE {{.ConsumerPartition}} (
    consumer_name TEXT    NOT NULL,
    partition_no  INTEGER NOT NULL,
    -- NULL when free (released, or never taken).
    owner         TEXT,
    epoch         INTEGER NOT NULL DEFAULT 0,
    lease_until   TEXT,
    PRIMARY KEY (consumer_name, partition_no)
) WITHOUT ROWID;
