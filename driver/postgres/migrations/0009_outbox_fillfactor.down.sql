ALTER TABLE {{.Outbox}} RESET (fillfactor);
