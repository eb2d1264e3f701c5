-- Fails, changing nothing, while two entries of a consumer share an event id:
-- re-drive or remove the extra ones first (idem failed list, retry, remove).
ALTER TABLE {{.FailedMessage}}
    ADD CONSTRAINT {{ident .FailedMessageName "event_key"}} UNIQUE (consumer_name, event_id);
DO $idem$
DECLARE
    s text;
BEGIN
    SELECT n.nspname INTO s
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = '{{.FailedMessage}}'::regclass;
    EXECUTE format('DROP INDEX %I.%I', s, '{{.FailedMessageName}}_event_idx');
END
$idem$;
