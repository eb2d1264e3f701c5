-- Payloads that are not JSON (Protobuf, Avro, any bytes): content_type is
-- the payload's media type (NULL: JSON, as every row before it), and
-- payload_binary holds the bytes of a payload that is not JSON, as a BLOB.
-- The writer fills payload for a JSON payload, as always, and
-- payload_binary for any other; a row has one or the other.
ALTER TABLE {{.Outbox}} ADD COLUMN content_type TEXT;
ALTER TABLE {{.Outbox}} ADD COLUMN payload_binary BLOB;
