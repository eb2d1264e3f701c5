-- Forgets the operators' actions: edited entries keep their edited message
-- and lose the original, archived entries are listed again.
ALTER TABLE {{.FailedMessage}} DROP COLUMN actions;
ALTER TABLE {{.FailedMessage}} DROP COLUMN archived_at;
ALTER TABLE {{.FailedMessage}} DROP COLUMN original_headers;
ALTER TABLE {{.FailedMessage}} DROP COLUMN original_body;
