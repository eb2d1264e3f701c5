-- Forgets content types and binary payloads: rows that hold one lose it.
ALTER TABLE {{.OutboxArchive}} DROP COLUMN payload_binary, DROP COLUMN content_type;
ALTER TABLE {{.Outbox}} DROP COLUMN payload_binary, DROP COLUMN content_type;
