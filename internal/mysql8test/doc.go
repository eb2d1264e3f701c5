// Package mysql8test tests the binlog reader (internal/mysqlrepl) against
// vitess.io/vitess's implementation of MySQL 8's server protocol and
// binlog events, as a stand-in for a MySQL 8 server, which the package
// registries this project builds from do not offer.
package mysql8test
