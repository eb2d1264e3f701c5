-- The outbox keeps Debezium's Outbox Event Router columns (id, aggregatetype,
-- aggregateid, type, payload) so Debezium can read it from the binlog and
-- other programs can write to it with those five columns only: every other
-- column has a default. Timestamps are UTC (DATETIME(6) holds no time zone).
CREATE TABLE {{.Outbox}} (
    id                CHAR(36) CHARACTER SET ascii NOT NULL,
    aggregatetype     VARCHAR(255) NOT NULL,
    aggregateid       VARCHAR(255) NOT NULL,
    type              VARCHAR(255) NOT NULL,
    payload           JSON NULL,
    occurred_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    aggregate_version BIGINT       NOT NULL DEFAULT 0,
    headers           JSON         NOT NULL DEFAULT ('{}'),
    -- Insertion order; the relay publishes each aggregate's rows in this order.
    seq               BIGINT       NOT NULL AUTO_INCREMENT,
    created_at        DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- Relay bookkeeping.
    published_at      DATETIME(6)  NULL,
    lease_owner       CHAR(36) CHARACTER SET ascii NULL,
    lease_until       DATETIME(6)  NULL,
    attempts          INT          NOT NULL DEFAULT 0,
    last_error        TEXT         NULL,
    PRIMARY KEY (id),
    UNIQUE KEY {{ident .OutboxName "seq_idx"}} (seq),
    KEY {{ident .OutboxName "pending_idx"}} (published_at, seq),
    KEY {{ident .OutboxName "aggregate_pending_idx"}} (aggregatetype, aggregateid, published_at, seq),
    KEY {{ident .OutboxName "occurred_at_idx"}} (occurred_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row; relays lock it to take their claims one after the other.
CREATE TABLE {{.ClaimLock}} (
    id TINYINT NOT NULL,
    PRIMARY KEY (id)
) ENGINE=InnoDB;
INSERT INTO {{.ClaimLock}} (id) VALUES (1);

-- One row per (consumer, event) applied. Written in the same transaction as
-- the handlers' effects.
CREATE TABLE {{.ProcessedEvent}} (
    consumer_name VARCHAR(200) NOT NULL,
    event_id      CHAR(36) CHARACTER SET ascii NOT NULL,
    processed_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer_name, event_id),
    KEY {{ident .ProcessedEventName "processed_at_idx"}} (processed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Messages a consumer could not decode or handle, kept exactly as received.
CREATE TABLE {{.FailedMessage}} (
    id              BIGINT       NOT NULL AUTO_INCREMENT,
    consumer_name   VARCHAR(200) NOT NULL,
    source          VARCHAR(255) NOT NULL DEFAULT '',
    event_id        CHAR(36) CHARACTER SET ascii NULL,
    event_name      VARCHAR(255) NOT NULL DEFAULT '',
    message_key     LONGBLOB     NULL,
    headers         JSON         NOT NULL DEFAULT ('{}'),
    body            LONGBLOB     NOT NULL,
    `error`         TEXT         NOT NULL,
    `errors`        JSON         NOT NULL DEFAULT ('[]'),
    attempts        INT          NOT NULL DEFAULT 0,
    first_failed_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    failed_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    UNIQUE KEY {{ident .FailedMessageName "event_key"}} (consumer_name, event_id),
    KEY {{ident .FailedMessageName "failed_at_idx"}} (failed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
