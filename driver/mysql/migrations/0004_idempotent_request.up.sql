-- Idempotency keys of incoming requests (package idempotency). A request
-- claims its key as "processing" in a statement of its own, committed at
-- once, so that a concurrent retry sees it; the response to replay is
-- stored ("done") in the application's transaction, with its business rows
-- and outbox events. A retry takes a processing key over once locked_until
-- has passed (its request crashed); keys are purged after expires_at.
--
-- Its name is Tables.IdempotentRequest, in Tables.Schema beside the
-- other tables. Keys and scopes never end with a space (package
-- idempotency refuses them), so the PAD SPACE collation compares them
-- exactly.
CREATE TABLE {{.IdempotentRequest}} (
    scope            VARCHAR(255) NOT NULL DEFAULT '',
    idem_key         VARCHAR(255) NOT NULL,
    fingerprint      VARCHAR(255) NOT NULL,
    state            VARCHAR(12)  NOT NULL,
    owner            CHAR(36) CHARACTER SET ascii NOT NULL,
    response_status  INT          NULL,
    -- The header fields to replay: a JSON object of string arrays.
    response_headers LONGTEXT     NULL,
    response_body    LONGBLOB     NULL,
    locked_until     DATETIME(6)  NOT NULL,
    expires_at       DATETIME(6)  NOT NULL,
    created_at       DATETIME(6)  NOT NULL,
    completed_at     DATETIME(6)  NULL,
    PRIMARY KEY (scope, idem_key),
    KEY {{ident .IdempotentRequestName "expires_at_idx"}} (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
