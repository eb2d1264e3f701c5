-- Each consumer's latest marker and its markers of the last minute, for
-- "idem status" and the dashboard, read in one probe and one short range
-- instead of every marker of the consumer.
ALTER TABLE {{.ProcessedEvent}}
    ADD KEY {{ident .ProcessedEventName "consumer_idx"}} (consumer_name, processed_at);
