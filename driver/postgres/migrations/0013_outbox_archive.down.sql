-- Forgets the archive: "idem replay" finds no period the CDC relay
-- published any more.
DROP TABLE {{.OutboxArchive}};
