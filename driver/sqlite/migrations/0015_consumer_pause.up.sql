-- The operators' pauses of consumers and relays (idem pause, inbox.Pause,
-- relay.Pause): one row per paused consumer (kind 'consumer', its name) or
-- outbox (kind 'relay', the outbox table's name). Every replica reads it,
-- so a pause reaches them all and survives restarts. starts_at NULL: at
-- once; ends_at NULL: until resumed. Timestamps are UTC text,
-- 'YYYY-MM-DD HH:MM:SS.ffffff'. Its name is Tables.ConsumerPause.
CREATE TABLE {{.ConsumerPause}} (
    kind      TEXT NOT NULL,
    name      TEXT NOT NULL,
    starts_at TEXT,
    ends_at   TEXT,
    reason    TEXT NOT NULL DEFAULT '',
    paused_by TEXT NOT NULL DEFAULT '',
    paused_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (kind, name)
) WITHOUT ROWID;
