-- Rows that were quarantined become claimable again.
DROP INDEX {{ident .OutboxName "quarantined_idx"}};
DROP INDEX {{ident .OutboxName "pending_idx"}};
ALTER TABLE {{.Outbox}} DROP COLUMN quarantined_at;
CREATE INDEX {{ident .OutboxName "pending_idx"}} ON {{.Outbox}} (seq) WHERE published_at IS NULL;
