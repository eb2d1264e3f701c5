DROP TABLE IF EXISTS {{.FailedMessage}};
DROP TABLE IF EXISTS {{.ProcessedEvent}};
DROP TABLE IF EXISTS {{.ClaimLock}};
DROP TABLE IF EXISTS {{.Outbox}};
