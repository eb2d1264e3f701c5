DO $idem$
DECLARE
    s text;
BEGIN
    SELECT n.nspname INTO s
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = '{{.ProcessedEvent}}'::regclass;
    EXECUTE format('DROP INDEX %I.%I', s, '{{.ProcessedEventName}}_consumer_idx');
END
$idem$;
