-- Rows still delayed become due at once.
ALTER TABLE {{.Outbox}}
    DROP INDEX {{ident .OutboxName "scheduled_idx"}},
    DROP INDEX {{ident .OutboxName "pending_idx"}},
    ADD INDEX {{ident .OutboxName "pending_idx"}} (published_at, quarantined_at, seq),
    DROP INDEX {{ident .OutboxName "aggregate_pending_idx"}},
    ADD INDEX {{ident .OutboxName "aggregate_pending_idx"}} (aggregatetype, aggregateid, published_at, seq),
    DROP COLUMN not_before;
