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
	OutboxTableDefault          = "outbox"
	ProcessedEventTableDefault  = "processed_event"
	FailedMessageTableDefault   = "failed_message"
	DeliveryAttemptTableDefault = "delivery_attempt"
	MigrationTableDefault       = "idem_schema_migration"
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
	// DeliveryAttempt is the table counting the failed attempts of events
	// not yet applied nor parked. Defaults to "delivery_attempt".
	DeliveryAttempt string
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
	if t.DeliveryAttempt == "" {
		t.DeliveryAttempt = DeliveryAttemptTableDefault
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
		{"FailedMessage", t.FailedMessage}, {"DeliveryAttempt", t.DeliveryAttempt}, {"Migrations", t.Migrations},
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

	// SaveFailed stores a message in the failure store. A message with an event
	// id already stored for the same consumer updates that entry, appending to
	// its error history.
	SaveFailed(ctx context.Context, ex Executor, m FailedMessage) (id int64, err error)
	// ListFailed lists stored failures matching f, newest first (by id),
	// or oldest first with f.Oldest. f.Limit is positive: callers page
	// with f.BeforeID or f.AfterID.
	ListFailed(ctx context.Context, ex Executor, f FailedFilter) ([]FailedMessage, error)
	// GetFailed returns one stored failure, or ErrNotFound.
	GetFailed(ctx context.Context, ex Executor, id int64) (FailedMessage, error)
	// DeleteFailed removes one stored failure and reports whether it existed.
	DeleteFailed(ctx context.Context, ex Executor, id int64) (bool, error)
	// PurgeFailed deletes at most limit stored failures whose last failure
	// is before before (of consumer only, when consumer is not empty) and
	// returns how many.
	PurgeFailed(ctx context.Context, ex Executor, consumer string, before time.Time, limit int) (int64, error)
	// ParkedAggregates returns, for each of aggs that has a stored failure
	// of consumer parked for its own failure (HeldBy 0) with a non-empty
	// aggregate id, the id of the oldest such failure. Aggregates without
	// one are absent from the map.
	ParkedAggregates(ctx context.Context, ex Executor, consumer string, aggs []AggregateRef) (map[AggregateRef]int64, error)
	// HasParkedAggregates reports whether consumer has any stored failure
	// that ParkedAggregates would report.
	HasParkedAggregates(ctx context.Context, ex Executor, consumer string) (bool, error)

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

// Mark is one processed_event marker to insert.
type Mark struct {
	// ID is the event id.
	ID uuid.UUID
	// Hash is a 64-bit hash of the event's content, to tell when an event
	// id comes back with other content. 0 means unknown (stored NULL).
	Hash int64
}

// AggregateRef names one aggregate: its type and id, as in the outbox's
// aggregatetype and aggregateid.
type AggregateRef struct {
	// Type is the aggregate type ("order").
	Type string
	// ID is the aggregate id ("42").
	ID string
}

// FailedMessage is an entry of the failure store: a received message kept
// exactly as it arrived, with why and how often it failed. Every field reads
// back byte for byte as it was saved, whatever bytes it holds.
type FailedMessage struct {
	// ID identifies the entry; ids grow in the order entries are created.
	ID int64
	// Consumer is the consumer name.
	Consumer string
	// Source is the queue, topic or subject the message came from.
	Source string
	// EventID is the event id; uuid.Nil when the message was undecodable.
	EventID uuid.UUID
	// EventName is the event name, when known.
	EventName string
	// AggregateType and AggregateID name the event's aggregate, when
	// known. Messages of one aggregate are handled in order: a later one
	// waits behind a parked one (see HeldBy).
	AggregateType string
	AggregateID   string
	// HeldBy is the id of the parked message of the same aggregate that
	// this one waits behind; 0 for a message parked for its own failure.
	HeldBy int64
	// Key is the message key (Kafka), as received.
	Key []byte
	// Headers are the message headers, as received.
	Headers map[string]string
	// Body is the message body, as received.
	Body []byte
	// Error is the last error.
	Error string
	// History lists every failure saved for the entry, oldest first.
	History []FailureRecord
	// Attempts is the number of failed attempts, over every save.
	Attempts int
	// FirstFailed and LastFailed are when the entry was created and last
	// saved.
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
	// Consumer matches the consumer name exactly.
	Consumer string
	// EventName matches the event name exactly.
	EventName string
	// AggregateType and AggregateID match the aggregate exactly (each
	// when not empty).
	AggregateType string
	AggregateID   string
	// HeldBy, when positive, matches the messages waiting behind that
	// parked message.
	HeldBy int64
	// Since matches messages that last failed at or after it.
	Since time.Time
	// BeforeID and AfterID, when positive, match ids below and above them:
	// the cursor of the next page (the last id of the previous one).
	BeforeID, AfterID int64
	// Oldest lists oldest first (ascending ids) instead of newest first.
	Oldest bool
	// Limit is the most entries returned. For inbox.FailureStore.List, 0
	// means all (it pages through them); dialects always receive a
	// positive page size.
	Limit int
}

// NextPage returns f with the cursor set past last, the last entry of a page
// listed with f: the filter of the next page.
func (f FailedFilter) NextPage(last FailedMessage) FailedFilter {
	if f.Oldest {
		f.AfterID = last.ID
	} else {
		f.BeforeID = last.ID
	}
	return f
}
