DROP TABLE {{.FailedMessage}};
DROP TABLE {{.ProcessedEvent}};
DROP TABLE {{.Outbox}};
