ALTER TABLE {{.ProcessedEvent}} DROP INDEX {{ident .ProcessedEventName "consumer_idx"}};
