// Package failover holds the tests of G12 on the databases: on PostgreSQL,
// the polling relay and a consumer working through a failover from a
// primary to its streaming standby (synchronous and asynchronous), with a
// multi-host URL (target_session_attrs=read-write); on MariaDB, the binlog
// relay, the polling relay and a consumer through a failover from a primary
// to its GTID replica (semi-synchronous and asynchronous), the services
// behind a moved VIP, the binlog relay restarted with the new primary's URL.
// It has no code of its own.
package failover
