-- The archive of the events the CDC relay published ("idem cdc", relay/cdc,
-- with its archive on): that relay leaves no published row in the outbox
-- (it deletes its rows, or leaves them to their writer unmarked, and a WAL
-- message is no row at all), so "idem replay" reads the period here. One
-- table for every outbox of the schema, as binlog_position: outbox_table
-- names the event's outbox, so that an outbox idem did not create (another
-- program's, with Debezium's columns) has its archive too. The relay
-- writes the events of each confirmed batch in the statement that deletes
-- their rows, in the order it published them (seq), and deletes those
-- published longer ago than its retention. The columns are the outbox's
-- that a message is made of; id is text, as a WAL message's or another
-- program's id may not be a UUID, and payload and headers are json, which
-- keeps the text published as it is (a WAL message's JSON may hold what
-- jsonb refuses, such as \u0000). An event written twice (a crash between
-- this statement and the slot's confirmation: the slot gives the
-- transaction again) is kept once, by its id.
CREATE TABLE {{.OutboxArchive}} (
    outbox_table      text        NOT NULL,
    id                text        NOT NULL,
    aggregatetype     text        NOT NULL,
    aggregateid       text        NOT NULL,
    type              text        NOT NULL,
    payload           json,
    occurred_at       timestamptz NOT NULL,
    aggregate_version bigint      NOT NULL DEFAULT 0,
    headers           json        NOT NULL DEFAULT '{}',
    -- The order in which the relay published the events.
    seq               bigint      GENERATED ALWAYS AS IDENTITY,
    published_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{ident .OutboxArchiveName "pkey"}} PRIMARY KEY (outbox_table, id)
);
CREATE UNIQUE INDEX {{ident .OutboxArchiveName "seq_idx"}} ON {{.OutboxArchive}} (seq);
CREATE INDEX {{ident .OutboxArchiveName "occurred_at_idx"}} ON {{.OutboxArchive}} (outbox_table, occurred_at);
CREATE INDEX {{ident .OutboxArchiveName "published_at_idx"}} ON {{.OutboxArchive}} (outbox_table, published_at);
