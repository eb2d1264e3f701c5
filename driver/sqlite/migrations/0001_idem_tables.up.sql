-- Timestamps are UTC text, 'YYYY-MM-DD HH:MM:SS.ffffff', which sorts like
-- the times it holds. Event ids are UUID text.
CREATE TABLE {{.Outbox}} (
    id                TEXT    NOT NULL UNIQUE,
    aggregatetype     TEXT    NOT NULL,
    aggregateid       TEXT    NOT NULL,
    type              TEXT    NOT NULL,
    payload           TEXT,
    occurred_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    aggregate_version INTEGER NOT NULL DEFAULT 0,
    headers           TEXT    NOT NULL DEFAULT '{}',
    -- Insertion order, never reused; the relay publishes each aggregate's
    -- rows in this order.
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at        TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    -- Relay bookkeeping.
    published_at      TEXT,
    lease_owner       TEXT,
    lease_until       TEXT,
    attempts          INTEGER NOT NULL DEFAULT 0,
    last_error        TEXT
);
CREATE INDEX {{ident .OutboxName "pending_idx"}} ON {{.Outbox}} (seq) WHERE published_at IS NULL;
CREATE INDEX {{ident .OutboxName "aggregate_pending_idx"}} ON {{.Outbox}} (aggregatetype, aggregateid, seq) WHERE published_at IS NULL;
CREATE INDEX {{ident .OutboxName "published_at_idx"}} ON {{.Outbox}} (published_at) WHERE published_at IS NOT NULL;
CREATE INDEX {{ident .OutboxName "occurred_at_idx"}} ON {{.Outbox}} (occurred_at);

-- One row per (consumer, event) applied. Written in the same transaction as
-- the handlers' effects.
CREATE TABLE {{.ProcessedEvent}} (
    consumer_name TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    processed_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (consumer_name, event_id)
) WITHOUT ROWID;
CREATE INDEX {{ident .ProcessedEventName "processed_at_idx"}} ON {{.ProcessedEvent}} (processed_at);

-- Messages a consumer could not decode or handle, kept exactly as received.
CREATE TABLE {{.FailedMessage}} (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer_name   TEXT    NOT NULL,
    source          TEXT    NOT NULL DEFAULT '',
    event_id        TEXT,
    event_name      TEXT    NOT NULL DEFAULT '',
    message_key     BLOB,
    headers         TEXT    NOT NULL DEFAULT '{}',
    body            BLOB    NOT NULL,
    error           TEXT    NOT NULL,
    errors          TEXT    NOT NULL DEFAULT '[]',
    attempts        INTEGER NOT NULL DEFAULT 0,
    first_failed_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    failed_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    UNIQUE (consumer_name, event_id)
);
CREATE INDEX {{ident .FailedMessageName "failed_at_idx"}} ON {{.FailedMessage}} (failed_at);
