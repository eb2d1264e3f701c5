DROP INDEX {{ident .ProcessedEventName "consumer_idx"}};
