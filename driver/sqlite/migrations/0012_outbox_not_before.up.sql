-- Delayed delivery: a row with not_before (UTC text, like every timestamp)
-- is not published before that time (idem.Event.NotBefore). NULL, what
-- every writer that does not know the column stores, means due at once.
--
-- A delayed row leaves the claim's two indexes until it is due: the claim
-- never reads a row that is not due. The relay clears not_before once it
-- has passed, and sets created_at to it (through scheduled_idx), which
-- puts the row into both: from then on it is an ordinary waiting row,
-- waiting since its due time.
ALTER TABLE {{.Outbox}} ADD COLUMN not_before TEXT;
DROP INDEX {{ident .OutboxName "pending_idx"}};
DROP INDEX {{ident .OutboxName "aggregate_pending_idx"}};
CREATE INDEX {{ident .OutboxName "pending_idx"}} ON {{.Outbox}} (seq)
    WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL;
CREATE INDEX {{ident .OutboxName "aggregate_pending_idx"}} ON {{.Outbox}} (aggregatetype, aggregateid, seq)
    WHERE published_at IS NULL AND not_before IS NULL;
CREATE INDEX {{ident .OutboxName "scheduled_idx"}} ON {{.Outbox}} (not_before)
    WHERE published_at IS NULL AND not_before IS NOT NULL;
