-- Idempotency keys of incoming requests (package idempotency). A request
-- claims its key as "processing" in a transaction of its own, committed at
-- once, so that a concurrent retry sees it; the response to replay is
-- stored ("done") in the application's transaction, with its business rows
-- and outbox events. A retry takes a processing key over once locked_until
-- has passed (its request crashed); keys are purged after expires_at.
--
-- Its name is Tables.IdempotentRequest, in Tables.Schema beside the
-- other tables.
CREATE TABLE {{.IdempotentRequest}} (
    -- Who the key belongs to ('' when keys are shared by every client),
    -- and the client's key: text without control characters.
    scope            text        NOT NULL DEFAULT '',
    idem_key         text        NOT NULL,
    -- What identifies the request the key was used with (by default a
    -- SHA-256 of its method, target and body, in hex).
    fingerprint      text        NOT NULL,
    state            text        NOT NULL,
    -- The token of the claim that holds the key.
    owner            text        NOT NULL,
    response_status  integer,
    -- The header fields to replay: a JSON object of string arrays.
    response_headers text,
    response_body    bytea,
    locked_until     timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    CONSTRAINT {{ident .IdempotentRequestName "pkey"}} PRIMARY KEY (scope, idem_key),
    CONSTRAINT {{ident .IdempotentRequestName "state_check"}} CHECK (state IN ('processing', 'done'))
);
CREATE INDEX {{ident .IdempotentRequestName "expires_at_idx"}} ON {{.IdempotentRequest}} (expires_at);
