-- Delayed delivery: a row with not_before (UTC) is not published before
-- that time (idem.Event.NotBefore). NULL, what every writer that does not
-- know the column stores, means due at once.
--
-- The claim reads pending_idx and aggregate_pending_idx with not_before IS
-- NULL, an equality on a column placed before seq: it never reads a row
-- that is not due, however many wait for next month. The polling relay
-- clears not_before once it has passed, and sets created_at to it (a
-- range of scheduled_idx, under the claim's lock): from then on the row is
-- an ordinary waiting row, waiting since its due time. The binlog relay
-- reads due rows through scheduled_idx and deletes them once published; it
-- never clears the column.
ALTER TABLE {{.Outbox}}
    ADD COLUMN not_before DATETIME(6) NULL,
    DROP INDEX {{ident .OutboxName "pending_idx"}},
    ADD INDEX {{ident .OutboxName "pending_idx"}} (published_at, quarantined_at, not_before, seq),
    DROP INDEX {{ident .OutboxName "aggregate_pending_idx"}},
    ADD INDEX {{ident .OutboxName "aggregate_pending_idx"}} (aggregatetype, aggregateid, published_at, not_before, seq),
    ADD INDEX {{ident .OutboxName "scheduled_idx"}} (published_at, not_before);
