-- Each consumer's latest marker and its markers of the last minute, for
-- "idem status" and the dashboard, read in one probe and one short range
-- instead of every marker of the consumer. Building it blocks writes to
-- processed_event while it runs; on a big table, create it first with
-- CREATE INDEX CONCURRENTLY under this name, then migrate (IF NOT EXISTS
-- keeps it).
CREATE INDEX IF NOT EXISTS {{ident .ProcessedEventName "consumer_idx"}} ON {{.ProcessedEvent}} (consumer_name, processed_at);
