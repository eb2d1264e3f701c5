-- A 64-bit hash of the event's content, to tell when an event id comes back
-- with other content. NULL when unknown.
ALTER TABLE {{.ProcessedEvent}} ADD COLUMN payload_hash INTEGER;

-- The aggregate of a parked message, and, for a message that waits behind
-- a parked message of its aggregate, that message's id (NULL for a message
-- parked for its own failure). Text columns of failed_message hold plain
-- text as it is and any other bytes encoded (see driver.FailedMessage).
ALTER TABLE {{.FailedMessage}} ADD COLUMN aggregate_type TEXT NOT NULL DEFAULT '';
ALTER TABLE {{.FailedMessage}} ADD COLUMN aggregate_id TEXT NOT NULL DEFAULT '';
ALTER TABLE {{.FailedMessage}} ADD COLUMN held_by INTEGER;
CREATE INDEX {{ident .FailedMessageName "aggregate_idx"}} ON {{.FailedMessage}} (consumer_name, aggregate_type, aggregate_id);

-- Failed attempts of an event per consumer, so that the count survives
-- restarts and rebalances whatever the transport. A row goes when the event
-- is applied or parked.
CREATE TABLE {{.DeliveryAttempt}} (
    consumer_name   TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT    NOT NULL DEFAULT '',
    first_failed_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    last_failed_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (consumer_name, event_id)
) WITHOUT ROWID;
CREATE INDEX {{ident .DeliveryAttemptName "last_failed_at_idx"}} ON {{.DeliveryAttempt}} (last_failed_at);
