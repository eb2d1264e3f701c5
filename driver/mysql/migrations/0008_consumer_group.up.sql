-- Ownership groups of consumers (inbox.Group): the replicas of one consumer
-- share its partitions. Each replica is a member with a lease it renews
-- (its heartbeat); each partition has at most one owner at a time, under a
-- lease of its own, whose epoch counts its tenures. Leases are timed by
-- the database's clock only (UTC_TIMESTAMP(6)). Their names are
-- Tables.ConsumerMember and Tables.ConsumerPartition, in Tables.Schema
-- beside the other tables.
CREATE TABLE {{.ConsumerMember}} (
    consumer_name VARCHAR(200) NOT NULL,
    member_id     VARCHAR(200) NOT NULL,
    lease_until   DATETIME(6)  NOT NULL,
    joined_at     DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer_name, member_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE {{.ConsumerPartition}} (
    consumer_name VARCHAR(200) NOT NULL,
    partition_no  INT          NOT NULL,
    -- NULL when free (released, or never taken).
    owner         VARCHAR(200) NULL,
    epoch         BIGINT       NOT NULL DEFAULT 0,
    lease_until   DATETIME(6)  NULL,
    PRIMARY KEY (consumer_name, partition_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
