DROP TABLE IF EXISTS {{.DeliveryAttempt}};
-- The error column stays LONGTEXT: narrowing it could fail on long errors.
ALTER TABLE {{.FailedMessage}}
    DROP KEY {{ident .FailedMessageName "aggregate_idx"}},
    DROP COLUMN held_by,
    DROP COLUMN aggregate_id,
    DROP COLUMN aggregate_type;
ALTER TABLE {{.ProcessedEvent}} DROP COLUMN payload_hash;
