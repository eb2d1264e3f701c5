-- The operators' pauses of consumers and relays (idem pause, inbox.Pause,
-- relay.Pause): one row per paused consumer (kind 'consumer', its name) or
-- outbox (kind 'relay', the outbox table's name). Every replica reads it,
-- so a pause reaches them all and survives restarts. starts_at NULL: at
-- once; ends_at NULL: until resumed. Times are UTC. Its name is
-- Tables.ConsumerPause.
CREATE TABLE {{.ConsumerPause}} (
    kind      VARCHAR(20)   NOT NULL,
    name      VARCHAR(200)  NOT NULL,
    starts_at DATETIME(6)   NULL,
    ends_at   DATETIME(6)   NULL,
    reason    VARCHAR(1000) NOT NULL DEFAULT '',
    paused_by VARCHAR(200)  NOT NULL DEFAULT '',
    paused_at DATETIME(6)   NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (kind, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
