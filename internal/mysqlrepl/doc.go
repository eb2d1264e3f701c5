// Package mysqlrepl is a small MariaDB and MySQL replication client and
// binlog event decoder: what the binlog relay (relay/binlog) needs to read
// an outbox table's inserts from a MariaDB or MySQL 8 server's binary log,
// and nothing more. It
// is written from scratch on the standard library, instead of
// vitess.io/vitess's mysql package (10 MB more binary and glog) or
// go-mysql.
//
// # Tour
//
// Dial connects and authenticates; StartDump asks for the binlog from a
// GTID position; ReadEvent returns the events one by one:
//
//	c, err := mysqlrepl.Dial(ctx, mysqlrepl.Config{Addr: "db:3306", User: "relay", Password: pw, ServerID: 4001})
//	...
//	err = c.StartDump(ctx, "0-1-1234") // @@gtid_binlog_pos when the reader started, or its saved Position
//	for {
//		ev, err := c.ReadEvent()
//		switch e := ev.(type) {
//		case *mysqlrepl.GTIDEvent:   // a transaction begins: e.GTID()
//		case *mysqlrepl.RowsEvent:   // rows of e.Table: e.Rows()
//		case *mysqlrepl.XIDEvent:    // it commits: the position moves to its GTID
//		}
//	}
//
// At the start of a dump, MariaDB 10.11 sends a fake RotateEvent
// (FlagArtificial, NextPos 0) naming the binlog file, that file's
// FormatDescriptionEvent, its GTIDListEvent and BINLOG_CHECKPOINT
// (OtherEvent), then, when the position is not at the file's start, a fake
// GTIDListEvent (FlagArtificial) holding the requested position, and then
// the event groups after the position: GTIDEvent, then a QueryEvent (DDL,
// Standalone) or TableMapEvent and RowsEvents (with binlog_format=ROW)
// ending with an XIDEvent (or a QueryEvent "COMMIT" for non-transactional
// tables). At the end of each file, a RotateEvent and the next file's
// format description follow. With Config.Heartbeat, a HeartbeatEvent comes
// whenever nothing was written for that long.
//
// MySQL 8 sends, for StartDump with a GTID set (COM_BINLOG_DUMP_GTID): a
// fake RotateEvent, the file's FormatDescriptionEvent and
// PreviousGTIDsEvent, then the transactions not in the set: a
// MySQLGTIDEvent, then a QueryEvent "BEGIN", TableMapEvents, RowsEvents (v2)
// and an XIDEvent, or a QueryEvent alone (DDL); with
// binlog_transaction_compression = ON, a TransactionPayloadEvent holding
// the BEGIN...XID events takes their place after the GTID event. Heartbeats
// may be HEARTBEAT_LOG_EVENT_V2 (a HeartbeatEvent too).
//
// The Parser under the Conn can be used alone (ParseEvent), on bytes from
// anywhere: a binlog file, a test, a fuzzer.
//
// # What it supports
//
//   - MariaDB 10.0+ (tested with 10.11) and MySQL 8.0 and 8.4 (tested
//     against vitess's implementation of MySQL's server protocol and
//     event builders, module internal/mysql8test: no MySQL server is run
//     here), binlog format version 4, the client/server protocol 4.1 over
//     TCP or a Unix socket;
//   - authentication with mysql_native_password and caching_sha2_password
//     (MySQL 8's default): its fast path, its full authentication over TLS
//     or a Unix socket, and without them, with
//     Config.AllowPublicKeyRetrieval, the server's RSA public key asked for
//     and the password sent encrypted (RSA-OAEP); an AuthSwitchRequest to
//     either plugin is followed, any other plugin is an error naming it;
//   - TLS when Config.TLS is set: the SSL request, the TLS handshake
//     (crypto/tls: the server's certificate verified, its name included
//     unless the configuration says otherwise; a client certificate when
//     the server asks for one), then the credentials over TLS; a server
//     that does not offer TLS is an error, never a fall back to plain text;
//   - GTID positions only, not file and offset: MariaDB's
//     (@slave_connect_state, Position) and MySQL's GTID sets
//     (COM_BINLOG_DUMP_GTID, GTIDSet, "uuid:1-N" per source);
//   - the CRC32 of every event is checked when the binlog has them
//     (binlog_checksum=CRC32, the default): ErrChecksum;
//   - packets of more than 16 MiB (large rows) are joined;
//   - rows events v1 (what MariaDB writes) and v2, with the table map's
//     optional metadata of binlog_row_metadata (column names, signedness,
//     ENUM and SET values, primary key); binlog_row_image=FULL for complete
//     rows (other images give RowsEvent.Partial);
//   - the column types MariaDB writes since 10.1 and MySQL 8 writes (see
//     RowsEvent.Rows), MySQL's binary JSON decoded to its text
//     (DecodeJSON), and the collations of MySQL's optional metadata
//     (Column.Collation, utf8mb4_0900_* ids 255 and above included);
//   - MySQL's GTID (33), anonymous GTID (34), previous GTIDs (35),
//     TRANSACTION_PAYLOAD (40: zstd, decompressed) and
//     HEARTBEAT_LOG_EVENT_V2 (41) events.
//
// # What it refuses
//
// Every refusal is an error wrapping ErrUnsupported that says what to
// change, never a guess: MySQL's partial JSON updates
// (PARTIAL_UPDATE_ROWS_EVENT, binlog_row_value_options = PARTIAL_JSON) and
// tagged GTIDs (MySQL 8.3+); MariaDB's compressed events and columns (log_bin_compress, COMPRESSED
// columns); temporal columns in the pre-10.1 format
// (mysql56_temporal_format=OFF, or tables created before 10.1); binlog
// formats older than version 4. Malformed bytes give an error wrapping
// ErrMalformed; no input makes a decoder panic (each has a fuzz test).
//
// # What the server answers
//
// Found with MariaDB 10.11.19: a position whose sequence number the
// domain has not reached ("0-1-999999999") and a position of another
// server in a domain that went past it (a diverged replica) are both error
// 1236 on the first ReadEvent ("...which is not in the master's binlog"),
// as is, by MariaDB's source, a position in a purged binlog ("Could not
// find GTID state requested by slave in any binlog files"; not tried: PURGE
// BINARY LOGS on the shared test server would break other readers):
// IsPurged recognises all three.
// A domain the server's binlogs never had is not an error: that domain,
// like every domain the position does not name, is streamed from the
// oldest binlog the server has; "" therefore streams every binlog kept.
package mysqlrepl
