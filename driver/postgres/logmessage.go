package postgres

import (
	"context"

	"github.com/idem-go/idem/driver"
)

var _ driver.LogMessageEmitter = (*dialect)(nil)

// EmitLogMessages writes contents as transactional logical decoding messages
// (pg_logical_emit_message(true, prefix, content)), in order, in ex's
// transaction. It implements driver.LogMessageEmitter.
func (d *dialect) EmitLogMessages(ctx context.Context, ex driver.Executor, prefix string, contents [][]byte) error {
	var err error
	if len(contents) == 1 {
		_, err = ex.Exec(ctx, emitOneSQL, prefix, contents[0])
	} else if len(contents) > 1 {
		_, err = ex.Exec(ctx, emitManySQL, prefix, contents)
	}
	return d.Wrap(err)
}

// The statements of EmitLogMessages. pg_logical_emit_message is volatile:
// the server evaluates it after the sort, so the messages follow the order
// of contents.
const (
	emitOneSQL  = `SELECT pg_logical_emit_message(true, $1::text, $2::bytea)`
	emitManySQL = `SELECT pg_logical_emit_message(true, $1::text, m) FROM unnest($2::bytea[]) WITH ORDINALITY AS t(m, i) ORDER BY i`
)
