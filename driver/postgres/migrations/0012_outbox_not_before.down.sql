-- Dropping the column drops the three indexes that name it. Rows still
-- delayed become due at once.
ALTER TABLE {{.Outbox}} DROP COLUMN not_before;
CREATE INDEX {{ident .OutboxName "pending_idx"}} ON {{.Outbox}} (seq) WHERE published_at IS NULL AND quarantined_at IS NULL;
CREATE INDEX {{ident .OutboxName "aggregate_pending_idx"}} ON {{.Outbox}} (aggregatetype, aggregateid, seq) WHERE published_at IS NULL;
