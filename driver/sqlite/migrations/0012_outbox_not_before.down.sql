-- Rows still delayed become due at once.
DROP INDEX {{ident .OutboxName "scheduled_idx"}};
DROP INDEX {{ident .OutboxName "pending_idx"}};
DROP INDEX {{ident .OutboxName "aggregate_pending_idx"}};
ALTER TABLE {{.Outbox}} DROP COLUMN not_before;
CREATE INDEX {{ident .OutboxName "pending_idx"}} ON {{.Outbox}} (seq) WHERE published_at IS NULL AND quarantined_at IS NULL;
CREATE INDEX {{ident .OutboxName "aggregate_pending_idx"}} ON {{.Outbox}} (aggregatetype, aggregateid, seq) WHERE published_at IS NULL;
