-- Quarantine: a row the relay cannot turn into a message, or that the broker
-- refused on every attempt, is set aside with quarantined_at (its error is in
-- last_error). Claims skip it and the later rows of its aggregate wait behind
-- it until an operator re-drives it (quarantined_at and attempts cleared) or
-- removes it: idem failed list|show|retry|remove --relay.
ALTER TABLE {{.Outbox}} ADD COLUMN quarantined_at TEXT;

-- The claim looks for heads in pending_idx: quarantined rows leave it. They
-- stay in aggregate_pending_idx, where the claim sees that they come first in
-- their aggregates.
DROP INDEX {{ident .OutboxName "pending_idx"}};
CREATE INDEX {{ident .OutboxName "pending_idx"}} ON {{.Outbox}} (seq) WHERE published_at IS NULL AND quarantined_at IS NULL;
CREATE INDEX {{ident .OutboxName "quarantined_idx"}} ON {{.Outbox}} (seq) WHERE quarantined_at IS NOT NULL;
