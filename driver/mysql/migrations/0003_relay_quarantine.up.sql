-- Quarantine: a row the relay cannot turn into a message, or that the broker
-- refused on every attempt, is set aside with quarantined_at (UTC; its error
-- is in last_error). Claims skip it and the later rows of its aggregate wait
-- behind it until an operator re-drives it (quarantined_at and attempts
-- cleared) or removes it: idem failed list|show|retry|remove --relay.
--
-- The claim looks for heads with published_at IS NULL AND quarantined_at IS
-- NULL in seq order: pending_idx takes quarantined_at before seq so that it
-- reads them without visiting quarantined rows, and lists the quarantined
-- ones as a range.
ALTER TABLE {{.Outbox}}
    ADD COLUMN quarantined_at DATETIME(6) NULL,
    DROP INDEX {{ident .OutboxName "pending_idx"}},
    ADD INDEX {{ident .OutboxName "pending_idx"}} (published_at, quarantined_at, seq);
