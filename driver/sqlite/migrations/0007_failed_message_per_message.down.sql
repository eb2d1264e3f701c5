-- The table is rebuilt with the unique key of 0001. Fails, changing
-- nothing, while two entries of a consumer share an event id: re-drive or
-- remove the extra ones first (idem failed list, retry, remove).
CREATE TABLE {{ident .FailedMessageName "rebuild"}} (
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
    aggregate_type  TEXT    NOT NULL DEFAULT '',
    aggregate_id    TEXT    NOT NULL DEFAULT '',
    held_by         INTEGER,
    UNIQUE (consumer_name, event_id)
);
INSERT INTO {{ident .FailedMessageName "rebuild"}} (
    id, consumer_name, source, event_id, event_name, message_key, headers, body, error, errors,
    attempts, first_failed_at, failed_at, aggregate_type, aggregate_id, held_by)
SELECT
    id, consumer_name, source, event_id, event_name, message_key, headers, body, error, errors,
    attempts, first_failed_at, failed_at, aggregate_type, aggregate_id, held_by
FROM {{.FailedMessage}};
-- Entry ids are never reused: the new table goes on from the old one's
-- sequence, not from its highest id left.
DELETE FROM sqlite_sequence WHERE name = '{{.FailedMessageName}}_rebuild';
INSERT INTO sqlite_sequence (name, seq)
SELECT '{{.FailedMessageName}}_rebuild', seq FROM sqlite_sequence WHERE name = '{{.FailedMessageName}}';
DROP TABLE {{.FailedMessage}};
ALTER TABLE {{ident .FailedMessageName "rebuild"}} RENAME TO {{.FailedMessage}};
CREATE INDEX {{ident .FailedMessageName "failed_at_idx"}} ON {{.FailedMessage}} (failed_at);
CREATE INDEX {{ident .FailedMessageName "aggregate_idx"}} ON {{.FailedMessage}} (consumer_name, aggregate_type, aggregate_id);
