-- Forgets the archive: "idem replay" finds no period the binlog relay
-- published any more.
DROP TABLE IF EXISTS {{.OutboxArchive}};
