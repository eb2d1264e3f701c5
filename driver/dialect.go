package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
)

// Default table names.
const (
	OutboxTableDefault         = "outbox"
	ProcessedEventTableDefault = "processed_event"
	FailedMessageTableDefault  = "failed_message"
	MigrationTableDefault      = "idem_schema_migration"
)

// Tables names the tables idem uses. Every name is optional; the zero value
// means the defaults in the connection's default schema.
type Tables struct {
	// Schema is the schema (PostgreSQL) or database (MySQL) holding the
	// tables. Empty means the connection's current one (search_path).
	Schema string
	// Outbox defaults to "outbox".
	Outbox string
	// ProcessedEvent defaults to "processed_event".
	ProcessedEvent string
	// FailedMessage defaults to "failed_message".
	FailedMessage string
	// Migrations is the table recording applied migrations. Defaults to
	// "idem_schema_migration".
	Migrations string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// WithDefaults returns t with empty names replaced by the defaults.
func (t Tables) WithDefaults() Tables {
	if t.Outbox == "" {
		t.Outbox = OutboxTableDefault
	}
	if t.ProcessedEvent == "" {
		t.ProcessedEvent = ProcessedEventTableDefault
	}
	if t.FailedMessage == "" {
		t.FailedMessage = FailedMessageTableDefault
	}
	if t.Migrations == "" {
		t.Migrations = MigrationTableDefault
	}
	return t
}

// Validate checks that every name is a plain SQL identifier (letters, digits,
// underscores, at most 63 characters). Names are quoted in SQL anyway; the rule
// keeps them portable across dialects and safe in index and channel names.
func (t Tables) Validate() error {
	t = t.WithDefaults()
	for _, f := range []struct{ field, v string }{
		{"Schema", t.Schema}, {"Outbox", t.Outbox}, {"ProcessedEvent", t.ProcessedEvent},
		{"FailedMessage", t.FailedMessage}, {"Migrations", t.Migrations},
	} {
		if f.field == "Schema" && f.v == "" {
			continue
		}
		if !identRE.MatchString(f.v) {
			return fmt.Errorf("idem: Tables.%s %q is not a valid identifier (letters, digits and _; at most 63 characters; not starting with a digit)", f.field, f.v)
		}
	}
	return nil
}

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
type Dialect interface {
	// Name is "postgres", "mysql" or "sqlite".
	Name() string
	// Tables returns the table names the dialect is bound to, with defaults.
	Tables() Tables
	// Migrations returns the schema migrations in version order.
	Migrations() []Migration
	// MigrationSupport returns what the migrator needs from the dialect.
	MigrationSupport() MigrationSupport

	// InsertOutbox inserts rows into the outbox.
	InsertOutbox(ctx context.Context, ex Executor, rows []OutboxRow) error

	// MarkProcessed inserts one processed_event marker per id for consumer,
	// skipping ids already there, and reports which ids it inserted. Only the
	// conflict on the (consumer_name, event_id) key counts as "already there";
	// every other error is returned. ids holds no duplicates.
	MarkProcessed(ctx context.Context, ex Executor, consumer string, ids []uuid.UUID) (inserted []bool, err error)
	// PurgeProcessed deletes at most limit markers processed before before
	// (of consumer only, when consumer is not empty) and returns how many.
	PurgeProcessed(ctx context.Context, ex Executor, consumer string, before time.Time, limit int) (int64, error)

	// SaveFailed stores a message in the failure store. A message with an event
	// id already stored for the same consumer updates that entry, appending to
	// its error history.
	SaveFailed(ctx context.Context, ex Executor, m FailedMessage) (id int64, err error)
	// ListFailed lists stored failures, newest first.
	ListFailed(ctx context.Context, ex Executor, f FailedFilter) ([]FailedMessage, error)
	// GetFailed returns one stored failure, or ErrNotFound.
	GetFailed(ctx context.Context, ex Executor, id int64) (FailedMessage, error)
	// DeleteFailed removes one stored failure and reports whether it existed.
	DeleteFailed(ctx context.Context, ex Executor, id int64) (bool, error)

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
	// migration on its own (see SplitStatements) and records each version
	// right after its migration, so that a failure leaves the recorded
	// versions true.
	TransactionalDDL bool
}

// OutboxRow is one event as the outbox stores it.
type OutboxRow struct {
	ID               uuid.UUID
	AggregateType    string
	AggregateID      string
	Type             string
	Payload          json.RawMessage
	OccurredAt       time.Time
	AggregateVersion int64
	Headers          map[string]string
}

// FailedMessage is an entry of the failure store: a received message kept
// exactly as it arrived, with why and how often it failed.
type FailedMessage struct {
	ID          int64
	Consumer    string
	Source      string // queue, topic or subject it came from
	EventID     uuid.UUID
	EventName   string
	Key         []byte
	Headers     map[string]string
	Body        []byte
	Error       string
	History     []FailureRecord
	Attempts    int
	FirstFailed time.Time
	LastFailed  time.Time
}

// FailureRecord is one failed attempt in a FailedMessage's history.
type FailureRecord struct {
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt"`
	Error   string    `json:"error"`
}

// FailedFilter selects entries of the failure store. Zero fields match all.
type FailedFilter struct {
	Consumer  string
	EventName string
	Since     time.Time
	Limit     int
}
