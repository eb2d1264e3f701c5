-- Ownership groups of consumers (inbox.Group): the replicas of one consumer
-- share its partitions. Each replica is a member with a lease it renews
-- (its heartbeat); each partition has at most one owner at a time, under a
-- lease of its own, whose epoch counts its tenures. Leases are timed by
-- the database's clock only. Their names are Tables.ConsumerMember and
-- Tables.ConsumerPartition.
CREATE TABLE {{.ConsumerMember}} (
    consumer_name text        NOT NULL,
    member_id     text        NOT NULL,
    lease_until   timestamptz NOT NULL,
    joined_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{ident .ConsumerMemberName "pkey"}} PRIMARY KEY (consumer_name, member_id)
);
CREATE TABLE {{.ConsumerPartition}} (
    consumer_name text        NOT NULL,
    partition_no  integer     NOT NULL,
    -- NULL when free (released, or never taken).
    owner         text,
    epoch         bigint      NOT NULL DEFAULT 0,
    lease_until   timestamptz,
    CONSTRAINT {{ident .ConsumerPartitionName "pkey"}} PRIMARY KEY (consumer_name, partition_no)
);
