-- A 64-bit hash of the event's content, to tell when an event id comes back
-- with other content. NULL when unknown.
ALTER TABLE {{.ProcessedEvent}} ADD COLUMN payload_hash BIGINT NULL;

-- The aggregate of a parked message, and, for a message that waits behind
-- a parked message of its aggregate, that message's id (NULL for a message
-- parked for its own failure). Text columns of failed_message hold plain
-- text as it is and any other bytes encoded (see driver.FailedMessage);
-- error texts may be long.
ALTER TABLE {{.FailedMessage}}
    ADD COLUMN aggregate_type VARCHAR(255) NOT NULL DEFAULT '',
    ADD COLUMN aggregate_id   VARCHAR(255) NOT NULL DEFAULT '',
    ADD COLUMN held_by        BIGINT       NULL,
    MODIFY `error` LONGTEXT NOT NULL,
    ADD KEY {{ident .FailedMessageName "aggregate_idx"}} (consumer_name, aggregate_type, aggregate_id);

-- Failed attempts of an event per consumer, so that the count survives
-- restarts and rebalances whatever the transport. A row goes when the event
-- is applied or parked.
CREATE TABLE {{.DeliveryAttempt}} (
    consumer_name   VARCHAR(200) NOT NULL,
    event_id        CHAR(36) CHARACTER SET ascii NOT NULL,
    attempts        INT          NOT NULL DEFAULT 0,
    last_error      LONGTEXT     NOT NULL,
    first_failed_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    last_failed_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer_name, event_id),
    KEY {{ident .DeliveryAttemptName "last_failed_at_idx"}} (last_failed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
