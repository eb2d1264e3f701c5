-- One failure-store entry per parked message: two different messages with
-- the same event id (a producer that reuses ids, a message re-driven from
-- another entry) are two entries, each with its own bytes and hold. The
-- consumer updates an entry only when it parks the same message again (the
-- copy of a re-drive, a redelivered or republished copy), which it finds by
-- the plain index that replaces the unique key.
--
-- 0001 declared the key in CREATE TABLE, where SQLite cannot drop it: the
-- table is rebuilt without it, with every row, id and index.
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
    held_by         INTEGER
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
CREATE INDEX {{ident .FailedMessageName "event_idx"}} ON {{.FailedMessage}} (consumer_name, event_id);
