-- Outbox ids that are not UUIDs: another program may write its own ids
-- (Debezium's article has id VARCHAR(64) and calls an event E42). The
-- relay publishes such an id of 1 to 64 bytes under the name-based UUID
-- idem.EventID derives from it, with the id in the header
-- idem-original-id; CHAR(36) CHARACTER SET ascii refused them at insert.
-- VARCHAR(64) counts characters: an id of up to 64 characters but over 64
-- bytes (not ASCII) is stored, and the relay quarantines it, saying why.
-- utf8mb4_bin compares ids byte for byte, as the derivation reads them.
-- The change of character set rebuilds the table (a copy that blocks
-- writes while it runs): run it while the outbox is short.
ALTER TABLE {{.Outbox}}
    MODIFY COLUMN id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
