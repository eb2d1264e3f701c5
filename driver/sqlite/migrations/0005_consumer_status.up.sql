-- Each consumer's latest marker and its markers of the last minute, for
-- "idem status" and the dashboard, read in one probe and one short range
-- instead of every marker of the consumer.
CREATE INDEX {{ident .ProcessedEventName "consumer_idx"}} ON {{.ProcessedEvent}} (consumer_name, processed_at);
