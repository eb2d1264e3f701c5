-- Forgets the ownership groups: running groups take their partitions
-- again from scratch once the tables are back.
DROP TABLE {{.ConsumerPartition}};
DROP TABLE {{.ConsumerMember}};
