-- Quarantine: a row the relay cannot turn into a message, or that the broker
-- refused on every attempt, is set aside with quarantined_at (its error is in
-- last_error). Claims skip it and the later rows of its aggregate wait behind
-- it until an operator re-drives it (quarantined_at and attempts cleared) or
-- removes it: idem failed list|show|retry|remove --relay.
ALTER TABLE {{.Outbox}} ADD COLUMN quarantined_at timestamptz;

-- The claim looks for heads in pending_idx: quarantined rows leave it, so
-- that claims do not read them again and again. They stay in
-- aggregate_pending_idx, where the claim sees that they come first in their
-- aggregates.
DO $idem$
DECLARE
    s text;
BEGIN
    SELECT n.nspname INTO s
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = '{{.Outbox}}'::regclass;
    EXECUTE format('DROP INDEX %I.%I', s, '{{.OutboxName}}_pending_idx');
END
$idem$;
CREATE INDEX {{ident .OutboxName "pending_idx"}} ON {{.Outbox}} (seq) WHERE published_at IS NULL AND quarantined_at IS NULL;
CREATE INDEX {{ident .OutboxName "quarantined_idx"}} ON {{.Outbox}} (seq) WHERE quarantined_at IS NOT NULL;
