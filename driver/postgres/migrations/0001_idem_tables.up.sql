-- The outbox keeps Debezium's Outbox Event Router columns (id, aggregatetype,
-- aggregateid, type, payload) so Debezium can read it and other programs can
-- write to it with those five columns only: every other column has a default.
CREATE TABLE {{.Outbox}} (
    id                uuid        NOT NULL,
    aggregatetype     text        NOT NULL,
    aggregateid       text        NOT NULL,
    type              text        NOT NULL,
    payload           jsonb,
    occurred_at       timestamptz NOT NULL DEFAULT now(),
    aggregate_version bigint      NOT NULL DEFAULT 0,
    headers           jsonb       NOT NULL DEFAULT '{}',
    -- Insertion order; the relay publishes each aggregate's rows in this order.
    seq               bigint      GENERATED ALWAYS AS IDENTITY,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- Relay bookkeeping.
    published_at      timestamptz,
    lease_owner       uuid,
    lease_until       timestamptz,
    attempts          integer     NOT NULL DEFAULT 0,
    last_error        text,
    CONSTRAINT {{ident .OutboxName "pkey"}} PRIMARY KEY (id)
);
CREATE UNIQUE INDEX {{ident .OutboxName "seq_idx"}} ON {{.Outbox}} (seq);
CREATE INDEX {{ident .OutboxName "pending_idx"}} ON {{.Outbox}} (seq) WHERE published_at IS NULL;
CREATE INDEX {{ident .OutboxName "aggregate_pending_idx"}} ON {{.Outbox}} (aggregatetype, aggregateid, seq) WHERE published_at IS NULL;
CREATE INDEX {{ident .OutboxName "published_at_idx"}} ON {{.Outbox}} (published_at) WHERE published_at IS NOT NULL;
CREATE INDEX {{ident .OutboxName "occurred_at_idx"}} ON {{.Outbox}} (occurred_at);

-- Wakes relays listening on the channel "<schema>.<table>" after each insert
-- statement; relays also poll, so a lost notification only delays a row.
CREATE FUNCTION {{.NotifyFunc}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, '');
    RETURN NULL;
END
$$;
CREATE TRIGGER {{ident .OutboxName "notify"}} AFTER INSERT ON {{.Outbox}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.NotifyFunc}}();

-- One row per (consumer, event) applied. Written in the same transaction as
-- the handlers' effects.
CREATE TABLE {{.ProcessedEvent}} (
    consumer_name text        NOT NULL,
    event_id      uuid        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{ident .ProcessedEventName "pkey"}} PRIMARY KEY (consumer_name, event_id)
);
CREATE INDEX {{ident .ProcessedEventName "processed_at_idx"}} ON {{.ProcessedEvent}} (processed_at);

-- Messages a consumer could not decode or handle, kept exactly as received.
CREATE TABLE {{.FailedMessage}} (
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    consumer_name   text        NOT NULL,
    source          text        NOT NULL DEFAULT '',
    event_id        uuid,
    event_name      text        NOT NULL DEFAULT '',
    message_key     bytea,
    headers         jsonb       NOT NULL DEFAULT '{}',
    body            bytea       NOT NULL,
    error           text        NOT NULL,
    errors          jsonb       NOT NULL DEFAULT '[]',
    attempts        integer     NOT NULL DEFAULT 0,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    failed_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{ident .FailedMessageName "pkey"}} PRIMARY KEY (id),
    CONSTRAINT {{ident .FailedMessageName "event_key"}} UNIQUE (consumer_name, event_id)
);
CREATE INDEX {{ident .FailedMessageName "failed_at_idx"}} ON {{.FailedMessage}} (failed_at);
