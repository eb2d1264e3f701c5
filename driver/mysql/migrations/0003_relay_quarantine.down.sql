-- Rows that were quarantined become claimable again.
ALTER TABLE {{.Outbox}}
    DROP INDEX {{ident .OutboxName "pending_idx"}},
    DROP COLUMN quarantined_at,
    ADD INDEX {{ident .OutboxName "pending_idx"}} (published_at, seq);
