DROP TABLE {{.DeliveryAttempt}};
DROP INDEX {{ident .FailedMessageName "aggregate_idx"}};
ALTER TABLE {{.FailedMessage}} DROP COLUMN held_by;
ALTER TABLE {{.FailedMessage}} DROP COLUMN aggregate_id;
ALTER TABLE {{.FailedMessage}} DROP COLUMN aggregate_type;
ALTER TABLE {{.ProcessedEvent}} DROP COLUMN payload_hash;
