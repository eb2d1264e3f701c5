-- Idempotency keys of incoming requests (package idempotency). A request
-- claims its key as "processing" in a transaction of its own, committed at
-- once, so that a concurrent retry sees it; the response to replay is
-- stored ("done") in the application's transaction, with its business rows
-- and outbox events. A retry takes a processing key over once locked_until
-- has passed (its request crashed); keys are purged after expires_at.
-- Its name is Tables.IdempotentRequest. Timestamps are UTC
-- text, 'YYYY-MM-DD HH:MM:SS.ffffff'.
CREATE TABLE {{.IdempotentRequest}} (
    scope            TEXT    NOT NULL DEFAULT '',
    idem_key         TEXT    NOT NULL,
    fingerprint      TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('processing', 'done')),
    owner            TEXT    NOT NULL,
    response_status  INTEGER,
    -- The header fields to replay: a JSON object of string arrays.
    response_headers TEXT,
    response_body    BLOB,
    locked_until     TEXT    NOT NULL,
    expires_at       TEXT    NOT NULL,
    created_at       TEXT    NOT NULL,
    completed_at     TEXT,
    PRIMARY KEY (scope, idem_key)
) WITHOUT ROWID;
CREATE INDEX {{ident .IdempotentRequestName "expires_at_idx"}} ON {{.IdempotentRequest}} (expires_at);
