-- What operators do to parked messages. An edit changes body and headers,
-- which a retry sends, and keeps the message as received in original_body
-- and original_headers (NULL for an entry never edited). An archived entry
-- (archived_at) is kept but listed only when asked for, and holds no
-- aggregate. actions is the entry's audit trail: one object per edit,
-- retry, redirect or archive ({"at", "action", "by", "detail"}), oldest
-- first.
ALTER TABLE {{.FailedMessage}}
    ADD COLUMN original_body    bytea,
    ADD COLUMN original_headers jsonb,
    ADD COLUMN archived_at      timestamptz,
    ADD COLUMN actions          jsonb NOT NULL DEFAULT '[]';
