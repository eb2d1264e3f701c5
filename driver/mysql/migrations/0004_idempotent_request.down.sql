-- Forgets every idempotency key: a retry of a request answered before runs
-- again.
DROP TABLE {{.IdempotentRequest}};
