-- Forgets content types and binary payloads: rows that hold one lose it.
ALTER TABLE {{.Outbox}} DROP COLUMN payload_binary;
ALTER TABLE {{.Outbox}} DROP COLUMN content_type;
