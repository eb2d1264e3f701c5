package driver

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/idem-go/idem"
)

// Migration is one versioned schema change, already rendered for the
// configured table names.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

// Dialect is one SQL flavour bound to a set of table names. Implementations live
// in driver/postgres, driver/mysql and driver/sqlite; every method is covered by
// the conformance suite in drivertest.
//
// Besides its own methods, a Dialect has every ability idem's packages need
// from a database: the polling relay's (RelayDialect), the status figures
// (StatusReader), a consumer's counts (ConsumerCounter), the ownership
// groups' leases (GroupLeases), the idempotency keys (IdempotencyKeys) and
// the operators' pauses (Pauses).
// The abilities only some databases have are interfaces of their own, which
// callers test for: OutboxListener, OutboxWaitListener and OutboxClaimer on
// a Driver, LogMessageEmitter and IdempotencyKeyLocker on a Dialect.
type Dialect interface {
	RelayDialect
	StatusReader
	ConsumerCounter
	GroupLeases
	IdempotencyKeys
	Pauses

	// Name is "postgres", "mysql" or "sqlite".
	Name() string
	// Tables returns the table names the dialect is bound to, with defaults.
	Tables() idem.Tables
	// Migrations returns the schema migrations in version order.
	Migrations() []Migration
	// MigrationSupport returns what the migrator needs from the dialect.
	MigrationSupport() MigrationSupport

	// InsertOutbox inserts rows into the outbox.
	InsertOutbox(ctx context.Context, ex Executor, rows []OutboxRow) error

	// MarkProcessed inserts one processed_event marker per mark for
	// consumer, with its payload hash (NULL when Hash is 0), skipping ids
	// already there, and reports which marks it inserted. Only the conflict
	// on the (consumer_name, event_id) key counts as "already there"; every
	// other error is returned. marks holds no duplicate ids.
	MarkProcessed(ctx context.Context, ex Executor, consumer string, marks []Mark) (inserted []bool, err error)
	// ProcessedHashes returns the payload hashes stored with the markers of
	// consumer for ids. Ids without a marker, or whose marker has no hash,
	// are absent from the map.
	ProcessedHashes(ctx context.Context, ex Executor, consumer string, ids []uuid.UUID) (map[uuid.UUID]int64, error)
	// PurgeProcessed deletes at most limit markers processed before before
	// (of consumer only, when consumer is not empty) and returns how many.
	PurgeProcessed(ctx context.Context, ex Executor, consumer string, before time.Time, limit int) (int64, error)

	// RecordAttempt counts one more failed attempt of event id by consumer
	// in delivery_attempt (the first one inserts the row), with errText as
	// its last error, and returns the number of failed attempts after it.
	// Concurrent calls for the same event each count once.
	RecordAttempt(ctx context.Context, ex Executor, consumer string, id uuid.UUID, errText string) (attempts int, err error)
	// ClearAttempts deletes the attempt counts of ids for consumer (applied
	// or parked events).
	ClearAttempts(ctx context.Context, ex Executor, consumer string, ids []uuid.UUID) error
	// PurgeAttempts deletes at most limit attempt counts whose last failure
	// is before before (of consumer only, when consumer is not empty) and
	// returns how many.
	PurgeAttempts(ctx context.Context, ex Executor, consumer string, before time.Time, limit int) (int64, error)

	// SaveFailed stores a message in the failure store and returns its
	// entry's id. The store holds one entry per parked message, whatever
	// event ids they carry: with m.ID 0 it inserts a new entry, even when
	// an entry of the same consumer has the same event id. With m.ID set,
	// it records one more failure of that entry of m.Consumer: Attempts
	// added to its attempts, a history record appended, Error, HeldBy and
	// the last failure time replaced, not archived any more; the message
	// the entry holds (body, headers, key, source, event id and name,
	// aggregate) stays as it was first stored, or as an operator edited
	// it. When that entry is gone (removed, purged) or belongs to another
	// consumer, it inserts m as a new entry instead.
	SaveFailed(ctx context.Context, ex Executor, m idem.FailedMessage) (id int64, err error)
	// FindFailed returns the id of the oldest stored failure of consumer
	// with event id id whose body, as edited or as received, is body byte
	// for byte (a copy of that message parked before), or 0 when there is
	// none. It reads through the (consumer_name, event_id) index.
	FindFailed(ctx context.Context, ex Executor, consumer string, id uuid.UUID, body []byte) (int64, error)
	// ListFailed lists stored failures matching f, newest first (by id),
	// or oldest first with f.Oldest: the archived ones with f.Archived, the
	// others without. f.Limit is positive: callers page with f.BeforeID or
	// f.AfterID.
	ListFailed(ctx context.Context, ex Executor, f idem.FailedFilter) ([]idem.FailedMessage, error)
	// CountFailed counts the stored failures ListFailed would list for f,
	// whatever f.Limit and f.Oldest: the total of a run over every match.
	CountFailed(ctx context.Context, ex Executor, f idem.FailedFilter) (int64, error)
	// GetFailed returns one stored failure, archived or not, or
	// idem.ErrNotFound.
	GetFailed(ctx context.Context, ex Executor, id int64) (idem.FailedMessage, error)
	// DeleteFailed removes one stored failure and reports whether it existed.
	DeleteFailed(ctx context.Context, ex Executor, id int64) (bool, error)
	// ChangeFailed changes one stored failure as an operator asks, and
	// appends c.Action to its audit trail (idem.FailedMessage.Actions). With
	// c.Edit, the entry's message becomes c.Body and c.Headers, and the
	// message as first stored is kept (idem.FailedMessage.Original) on its
	// first edit; with c.Archive, the entry is archived, unless it is
	// already. It reports whether the entry exists.
	ChangeFailed(ctx context.Context, ex Executor, id int64, c FailedChange) (bool, error)
	// PurgeFailed deletes at most limit stored failures whose last failure
	// is before before (of consumer only, when consumer is not empty) and
	// returns how many.
	PurgeFailed(ctx context.Context, ex Executor, consumer string, before time.Time, limit int) (int64, error)
	// ParkedAggregates returns, for each of aggs that has a stored failure
	// of consumer parked for its own failure (HeldBy 0) with a non-empty
	// aggregate id, and not archived, the id of the oldest such failure.
	// Aggregates without one are absent from the map.
	ParkedAggregates(ctx context.Context, ex Executor, consumer string, aggs []idem.AggregateRef) (map[idem.AggregateRef]int64, error)
	// HasParkedAggregates reports whether consumer has any stored failure
	// that ParkedAggregates would report.
	HasParkedAggregates(ctx context.Context, ex Executor, consumer string) (bool, error)

	// UpsertVersioned inserts the row of p.Key, or updates it when p.Version
	// is newer than the stored version, in the transaction behind ex (the
	// state copy of the first source article: a late, older event never
	// overwrites newer state). Concurrent calls for one key are serialised
	// on the row.
	UpsertVersioned(ctx context.Context, ex Executor, p UpsertVersionedParams) (UpsertVersionedResult, error)

	// IsTransient reports whether err says that the database is away for
	// now (connection refused, reset or lost, a timeout, the server
	// shutting down or starting, too many connections, a read-only server,
	// a full disk) or that the transaction lost a race that running it
	// again resolves (serialization failure, deadlock, lock wait timeout).
	// It reads the driver's error types and codes, never messages.
	IsTransient(err error) bool
	// IsMissingTable reports whether err says a table does not exist.
	IsMissingTable(err error) bool
}

// MigrationSupport is what the migrator needs from a dialect.
type MigrationSupport struct {
	// CreateTable creates the migrations table if it does not exist.
	CreateTable string
	// Lock, run in the migration transaction, serialises concurrent
	// migrators. Empty when the dialect needs none. When Unlock is set, Lock
	// takes a session-level lock and returns one row whose first column is 1
	// when it was taken (MySQL's GET_LOCK).
	Lock string
	// Unlock releases the session-level lock taken by Lock. The migrator runs
	// it on the same connection before the transaction ends. Empty for
	// transaction-scoped locks.
	Unlock string
	// SelectVersions lists applied versions, ascending.
	SelectVersions string
	// InsertVersion records a version (args: version, name).
	InsertVersion string
	// DeleteVersion forgets a version (arg: version).
	DeleteVersion string
	// TransactionalDDL is true when DDL rolls back with its transaction.
	// When it is false (MySQL), the migrator runs each statement of a
	// migration on its own (see migrate.SplitStatements) and records each version
	// right after its migration, so that a failure leaves the recorded
	// versions true.
	TransactionalDDL bool
}

// OutboxRow is one event as the outbox stores it.
type OutboxRow struct {
	ID            uuid.UUID
	AggregateType string
	AggregateID   string
	Type          string
	// Payload is JSON when ContentType is empty or a JSON type
	// (idem.IsJSONContentType), stored in the payload column; else raw
	// bytes, stored in payload_binary.
	Payload          json.RawMessage
	OccurredAt       time.Time
	AggregateVersion int64
	Headers          map[string]string
	// NotBefore is when the row is due (the not_before column); zero is
	// NULL: due at once.
	NotBefore time.Time
	// ContentType is the payload's media type (column content_type, NULL
	// when empty).
	ContentType string
}

// FailedChange is what an operator changes in a stored failure
// (Dialect.ChangeFailed).
type FailedChange struct {
	// Edit replaces the entry's message with Body and Headers.
	Edit    bool
	Body    []byte
	Headers map[string]string
	// Archive archives the entry.
	Archive bool
	// Action is the record appended to the entry's audit trail.
	Action idem.FailedAction
}

// Mark is one processed_event marker to insert.
type Mark struct {
	// ID is the event id.
	ID uuid.UUID
	// Hash is a 64-bit hash of the event's content, to tell when an event
	// id comes back with other content. 0 means unknown (stored NULL).
	Hash int64
}
