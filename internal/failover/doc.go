// Package failover holds the tests of G12 on PostgreSQL: the polling relay
// and a consumer working through a failover from a primary to its streaming
// standby (synchronous and asynchronous), with a multi-host URL
// (target_session_attrs=read-write). It has no code of its own.
package failover
