-- The operators' pauses of consumers and relays (idem pause, inbox.Pause,
-- relay.Pause): one row per paused consumer (kind 'consumer', its name) or
-- outbox (kind 'relay', the outbox table's name). Every replica reads it,
-- so a pause reaches them all and survives restarts. starts_at NULL: at
-- once; ends_at NULL: until resumed. Its name is Tables.ConsumerPause.
CREATE TABLE {{.ConsumerPause}} (
    kind      text        NOT NULL,
    name      text        NOT NULL,
    starts_at timestamptz,
    ends_at   timestamptz,
    reason    text        NOT NULL DEFAULT '',
    paused_by text        NOT NULL DEFAULT '',
    paused_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{ident .ConsumerPauseName "pkey"}} PRIMARY KEY (kind, name)
);
