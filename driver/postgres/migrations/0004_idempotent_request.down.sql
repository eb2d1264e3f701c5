-- Forgets every idempotency key: a retry of a request answered before runs
-- again.
DROP TABLE {{print (slice .Outbox 0 (len (slice .Outbox (len (ident .OutboxName))))) (ident "idempotent_request")}};
