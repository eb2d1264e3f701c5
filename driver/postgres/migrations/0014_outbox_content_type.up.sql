-- Payloads that are not JSON (Protobuf, Avro, any bytes): content_type is
-- the payload's media type (NULL: JSON, as every row before it), and
-- payload_binary holds the bytes of a payload that is not JSON, without the
-- base64 that a json column would need. The writer fills payload for a JSON
-- payload, as always (foreign writers and Debezium's tables are unchanged),
-- and payload_binary for any other; a row has one or the other. The
-- archive of the CDC relay keeps both, so that "idem replay" publishes the
-- same bytes again.
ALTER TABLE {{.Outbox}} ADD COLUMN content_type text, ADD COLUMN payload_binary bytea;
ALTER TABLE {{.OutboxArchive}} ADD COLUMN content_type text, ADD COLUMN payload_binary bytea;
