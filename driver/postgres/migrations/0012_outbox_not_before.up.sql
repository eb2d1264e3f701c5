-- Delayed delivery: a row with not_before is not published before that time
-- (idem.Event.NotBefore). NULL, what every writer that does not know the
-- column stores, means due at once.
--
-- A delayed row leaves the claim's two indexes until it is due: pending_idx
-- (where the claim looks for heads) and aggregate_pending_idx (where it
-- checks that a head comes first in its aggregate and takes the rows after
-- it) hold only rows whose not_before is NULL, so the claim never reads a
-- row that is not due, however many wait for next month. The polling relay
-- clears not_before once it has passed, and sets created_at to it (one
-- UPDATE through scheduled_idx, under the claim's lock), which puts the row
-- into both indexes: from then on it is an ordinary waiting row, waiting
-- since its due time. The CDC relay reads due rows through scheduled_idx
-- and deletes them once published; it never clears the column.
ALTER TABLE {{.Outbox}} ADD COLUMN not_before timestamptz;

DO $idem$
DECLARE
    s text;
BEGIN
    SELECT n.nspname INTO s
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = '{{.Outbox}}'::regclass;
    EXECUTE format('DROP INDEX %I.%I', s, '{{.OutboxName}}_pending_idx');
    EXECUTE format('DROP INDEX %I.%I', s, '{{.OutboxName}}_aggregate_pending_idx');
END
$idem$;
CREATE INDEX {{ident .OutboxName "pending_idx"}} ON {{.Outbox}} (seq)
    WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL;
CREATE INDEX {{ident .OutboxName "aggregate_pending_idx"}} ON {{.Outbox}} (aggregatetype, aggregateid, seq)
    WHERE published_at IS NULL AND not_before IS NULL;
CREATE INDEX {{ident .OutboxName "scheduled_idx"}} ON {{.Outbox}} (not_before)
    WHERE published_at IS NULL AND not_before IS NOT NULL;
