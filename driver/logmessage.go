package driver

import "context"

// LogMessageEmitter is an optional ability of a Dialect, which
// outbox.NewLogWriter needs: writing an event into the database's
// write-ahead log without a row (PostgreSQL's pg_logical_emit_message),
// read back by a logical replication relay (package relay/cdc).
type LogMessageEmitter interface {
	// EmitLogMessages writes each of contents, in order, as a transactional
	// logical decoding message with prefix: it is decoded when, and only
	// if, the transaction of ex commits, at the transaction's place in
	// commit order.
	EmitLogMessages(ctx context.Context, ex Executor, prefix string, contents [][]byte) error
}
