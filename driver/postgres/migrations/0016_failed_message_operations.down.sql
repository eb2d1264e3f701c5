-- Forgets the operators' actions: edited entries keep their edited message
-- and lose the original, archived entries are listed again.
ALTER TABLE {{.FailedMessage}}
    DROP COLUMN actions,
    DROP COLUMN archived_at,
    DROP COLUMN original_headers,
    DROP COLUMN original_body;
