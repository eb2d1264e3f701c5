-- One failure-store entry per parked message: two different messages with
-- the same event id (a producer that reuses ids, a message re-driven from
-- another entry) are two entries, each with its own bytes and hold. The
-- consumer updates an entry only when it parks the same message again (the
-- copy of a re-drive, a redelivered or republished copy), which it finds by
-- the plain index that replaces the unique key.
CREATE INDEX {{ident .FailedMessageName "event_idx"}} ON {{.FailedMessage}} (consumer_name, event_id);
ALTER TABLE {{.FailedMessage}} DROP CONSTRAINT {{ident .FailedMessageName "event_key"}};
