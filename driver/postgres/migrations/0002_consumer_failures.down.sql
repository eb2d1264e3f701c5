DROP TABLE {{.DeliveryAttempt}};
-- Dropping the columns drops the aggregate index with them.
ALTER TABLE {{.FailedMessage}}
    DROP COLUMN held_by,
    DROP COLUMN aggregate_id,
    DROP COLUMN aggregate_type;
ALTER TABLE {{.ProcessedEvent}} DROP COLUMN payload_hash;
