-- Fails, changing nothing, while two entries of a consumer share an event id:
-- re-drive or remove the extra ones first (idem failed list, retry, remove).
ALTER TABLE {{.FailedMessage}}
    ADD UNIQUE KEY {{ident .FailedMessageName "event_key"}} (consumer_name, event_id),
    DROP KEY {{ident .FailedMessageName "event_idx"}};
