package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
)

// LogPrefixDefault is the start of the default prefix of the WAL messages
// written by a Writer of NewLogWriter and read by the CDC relay (package
// relay/cdc): see LogPrefix.
const LogPrefixDefault = "idem.outbox"

// LogPrefix returns the default prefix of the WAL messages of an outbox:
// "idem.outbox:<schema>.<table>", schema "public" when t.Schema is empty.
// WAL messages reach every replication slot of the database, so each outbox
// needs a prefix of its own: with one shared prefix, the relay of every
// outbox would publish the events of all of them.
func LogPrefix(t idem.Tables) string {
	t = t.WithDefaults()
	return LogPrefixDefault + ":" + cmp.Or(t.Schema, "public") + "." + t.Outbox
}

// ErrNotSupported is returned (wrapped) by NewLogWriter for a driver whose
// dialect cannot write events into the database's log.
var ErrNotSupported = errors.New("idem: outbox: not supported by this database")

// NewLogWriter returns a Writer that writes each event into the database's
// write-ahead log instead of the outbox table: Add and AddExec call
// pg_logical_emit_message(true, prefix, <event>) in the caller's
// transaction. The message exists if and only if the transaction commits,
// at its place in commit order; it costs one WAL record and no row, index or
// vacuum. Only a CDC relay (package relay/cdc, "idem cdc") reading the same
// prefix publishes these events: the polling relay never sees them.
//
// A delayed event (idem.Event.NotBefore in the future) needs a row to wait
// in: Add refuses it with an error wrapping ErrNotSupported.
//
// The message is a JSON document with the outbox's column names. A payload
// that is not JSON (idem.Event.ContentType) is carried in it base64-encoded,
// as "payload_base64" next to "content_type", a third larger than the bytes
// (the outbox table keeps such payloads as they are, in payload_binary).
//
// prefix "" means LogPrefix of drv's tables. NewLogWriter returns an error wrapping
// ErrNotSupported when drv's dialect does not implement
// driver.LogMessageEmitter (only PostgreSQL does).
func NewLogWriter[TTx any](drv driver.Driver[TTx], prefix string) (*Writer[TTx], error) {
	em, ok := drv.Dialect().(driver.LogMessageEmitter)
	if !ok {
		return nil, fmt.Errorf("%w: the %s dialect cannot write events into its log (PostgreSQL's pg_logical_emit_message); use NewWriter and a relay", ErrNotSupported, drv.Dialect().Name())
	}
	if prefix == "" {
		prefix = LogPrefix(drv.Dialect().Tables())
	}
	w := NewWriter(drv)
	w.emitter = em
	w.prefix = prefix
	return w, nil
}

// emit writes rows as WAL messages.
func (w *Writer[TTx]) emit(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow) error {
	contents := make([][]byte, len(rows))
	for i, row := range rows {
		b, err := outboxcodec.EncodeLogMessage(row)
		if err != nil {
			return fmt.Errorf("idem: outbox: event %d: %w", i, err)
		}
		contents[i] = b
	}
	if err := w.emitter.EmitLogMessages(ctx, ex, w.prefix, contents); err != nil {
		return fmt.Errorf("idem: outbox: write %d event(s) into the log: %w", len(rows), err)
	}
	return nil
}
