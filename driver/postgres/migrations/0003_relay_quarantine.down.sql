-- Dropping the column drops the two indexes that name it. Rows that were
-- quarantined become claimable again.
ALTER TABLE {{.Outbox}} DROP COLUMN quarantined_at;
CREATE INDEX {{ident .OutboxName "pending_idx"}} ON {{.Outbox}} (seq) WHERE published_at IS NULL;
