-- A 64-bit hash of the event's content, to tell when an event id comes back
-- with other content. NULL when unknown.
ALTER TABLE {{.ProcessedEvent}} ADD COLUMN payload_hash bigint;

-- The aggregate of a parked message, and, for a message that waits behind
-- a parked message of its aggregate, that message's id (NULL for a message
-- parked for its own failure). Text columns of failed_message hold plain
-- text as it is and any other bytes encoded (see driver.FailedMessage).
ALTER TABLE {{.FailedMessage}}
    ADD COLUMN aggregate_type text NOT NULL DEFAULT '',
    ADD COLUMN aggregate_id   text NOT NULL DEFAULT '',
    ADD COLUMN held_by        bigint;
CREATE INDEX {{ident .FailedMessageName "aggregate_idx"}} ON {{.FailedMessage}} (consumer_name, aggregate_type, aggregate_id);

-- Failed attempts of an event per consumer, so that the count survives
-- restarts and rebalances whatever the transport. A row goes when the event
-- is applied or parked.
CREATE TABLE {{.DeliveryAttempt}} (
    consumer_name   text        NOT NULL,
    event_id        uuid        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NOT NULL DEFAULT '',
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{ident .DeliveryAttemptName "pkey"}} PRIMARY KEY (consumer_name, event_id)
);
CREATE INDEX {{ident .DeliveryAttemptName "last_failed_at_idx"}} ON {{.DeliveryAttempt}} (last_failed_at);
