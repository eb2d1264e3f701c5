// Package interop holds the tests that an outbox row reaches consumers as
// one event whichever program published it: Debezium's Outbox Event Router
// (the record a Kafka Connect worker writes, made here by a plain Kafka
// producer), idem's polling relay or its binlog relay. They run real
// components end to end (MariaDB, the relays, kfake, an inbox.Consumer),
// which no package of the library imports all together: a test package of
// its own keeps the imports one way.
package interop
