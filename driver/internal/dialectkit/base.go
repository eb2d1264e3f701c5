// Package dialectkit is what every dialect shares: Base, which implements
// the methods whose Go code is the same for PostgreSQL, MySQL and SQLite
// given each one's statements (Spec), and the helpers of the others
// (migrations, outbox inserts, the failure store's rows, connection
// errors).
package dialectkit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"text/template"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/failrow"
)

// Names are the table names a dialect's migrations and statements use:
// quoted and qualified (Outbox), or bare, for the names of indexes and
// constraints (OutboxName). The migration templates read them.
type Names struct {
	Outbox, ProcessedEvent, FailedMessage, DeliveryAttempt string
	IdempotentRequest, ConsumerMember, ConsumerPartition   string
	Migrations, BinlogPosition                             string
	OutboxName, ProcessedEventName, FailedMessageName      string
	DeliveryAttemptName, IdempotentRequestName             string
	ConsumerMemberName, ConsumerPartitionName              string
	ClaimLock                                              string // MySQL's claim lock table
	NotifyFunc                                             string // PostgreSQL's trigger function
	// OutboxArchive is the archive of the events the CDC relays published
	// (migration 0013 of PostgreSQL and MySQL).
	OutboxArchive, OutboxArchiveName string
	// ConsumerPause is the table of the operators' pauses (migration
	// 0015).
	ConsumerPause, ConsumerPauseName string
}

// TableNames returns the names of t (with defaults), quoted by quote and
// qualified with t.Schema when it is set.
func TableNames(t idem.Tables, quote func(string) string) Names {
	qualify := func(name string) string {
		if t.Schema == "" {
			return quote(name)
		}
		return quote(t.Schema) + "." + quote(name)
	}
	return Names{
		Outbox:                qualify(t.Outbox),
		ProcessedEvent:        qualify(t.ProcessedEvent),
		FailedMessage:         qualify(t.FailedMessage),
		DeliveryAttempt:       qualify(t.DeliveryAttempt),
		IdempotentRequest:     qualify(t.IdempotentRequest),
		ConsumerMember:        qualify(t.ConsumerMember),
		ConsumerPartition:     qualify(t.ConsumerPartition),
		Migrations:            qualify(t.Migrations),
		BinlogPosition:        qualify(t.BinlogPosition),
		OutboxName:            t.Outbox,
		ProcessedEventName:    t.ProcessedEvent,
		FailedMessageName:     t.FailedMessage,
		DeliveryAttemptName:   t.DeliveryAttempt,
		IdempotentRequestName: t.IdempotentRequest,
		ConsumerMemberName:    t.ConsumerMember,
		ConsumerPartitionName: t.ConsumerPartition,
		ClaimLock:             qualify(t.Outbox + "_claim_lock"),
		NotifyFunc:            qualify(t.Outbox + "_notify"),
		OutboxArchive:         qualify(t.OutboxArchive),
		OutboxArchiveName:     t.OutboxArchive,
		ConsumerPause:         qualify(t.ConsumerPause),
		ConsumerPauseName:     t.ConsumerPause,
	}
}

// FailedSQL are a dialect's statements on the failure store that Base runs.
type FailedSQL struct {
	// Find selects the id of the oldest entry of a consumer (encoded as
	// the store keeps text), an event id and a body, as edited or as
	// received (the body twice): FindFailed's query.
	Find string
	// Get selects one entry by id, in the columns of QueryFailed.
	Get string
	// Delete deletes one entry by id.
	Delete string
	// HasParked selects whether a consumer (encoded) has an entry parked
	// for its own failure with a non-empty aggregate id, not archived.
	HasParked string
	// Time is QueryFailed's timeDest.
	Time func(*time.Time) any
}

// Spec describes a dialect to NewBase: what differs between dialects in
// the methods Base implements.
type Spec struct {
	// Name is the dialect's name (driver.Dialect.Name).
	Name string
	// Tables are the dialect's tables, validated, with defaults.
	Tables idem.Tables
	// Names are the names of Tables, as TableNames returns them.
	Names Names
	// Quote quotes an identifier (the ident function of the migration
	// templates).
	Quote func(string) string
	// Migrations holds the migration templates, migrations/NNNN_name.up.sql
	// and migrations/NNNN_name.down.sql.
	Migrations fs.FS
	// MigrationSupport is what the migrator needs.
	MigrationSupport driver.MigrationSupport
	// IsMissingTable and IsTransient classify the dialect's errors.
	IsMissingTable, IsTransient func(error) bool
	// Status are the statements of ReadStatus.
	Status StatusSQL
	// ConsumerCounts selects a consumer's parked messages and its retried
	// events (driver.ConsumerCounter), given the consumer's name as
	// failed_message stores it (failrow.Text), then as stored elsewhere.
	ConsumerCounts string
	// Groups are the statements of the ownership groups.
	Groups GroupSQL
	// Failed are the failure store's statements that Base runs.
	Failed FailedSQL
	// Pauses are the statements of the operators' pauses.
	Pauses PauseSQL
}

// Base implements what every dialect shares, rendered once by NewBase: its
// name, tables and migrations, its error classification (with the "run idem
// migrate" hint), driver.StatusReader, driver.ConsumerCounter,
// driver.GroupLeases, driver.Pauses, and the failure store's lookups. A
// dialect embeds it.
type Base struct {
	spec       Spec
	migrations []driver.Migration
}

// NewBase renders s's migrations and returns the Base of s.
func NewBase(s Spec) (*Base, error) {
	funcs := template.FuncMap{"ident": func(parts ...string) string { return s.Quote(strings.Join(parts, "_")) }}
	migs, err := LoadMigrations(s.Migrations, "migrations", s.Names, funcs)
	if err != nil {
		return nil, err
	}
	return &Base{spec: s, migrations: migs}, nil
}

// Names returns the dialect's table names.
func (b *Base) Names() Names { return b.spec.Names }

// Name implements driver.Dialect.
func (b *Base) Name() string { return b.spec.Name }

// Tables implements driver.Dialect.
func (b *Base) Tables() idem.Tables { return b.spec.Tables }

// Migrations implements driver.Dialect.
func (b *Base) Migrations() []driver.Migration { return b.migrations }

// MigrationSupport implements driver.Dialect.
func (b *Base) MigrationSupport() driver.MigrationSupport { return b.spec.MigrationSupport }

// IsTransient implements driver.Dialect.
func (b *Base) IsTransient(err error) bool { return b.spec.IsTransient(err) }

// IsMissingTable implements driver.Dialect.
func (b *Base) IsMissingTable(err error) bool { return b.spec.IsMissingTable(err) }

// Wrap adds the "run idem migrate" hint to missing-table errors: it returns
// err wrapping idem.ErrMissingTable instead, unless it wraps it already.
func (b *Base) Wrap(err error) error {
	if err == nil || errors.Is(err, idem.ErrMissingTable) || !b.spec.IsMissingTable(err) {
		return err
	}
	return fmt.Errorf("%w (%v)", idem.ErrMissingTable, err)
}

// ConsumerCounts implements driver.ConsumerCounter.
func (b *Base) ConsumerCounts(ctx context.Context, ex driver.Executor, consumer string) (driver.ConsumerCounts, error) {
	var c driver.ConsumerCounts
	err := driver.QueryRow(ctx, ex, b.spec.ConsumerCounts, []any{failrow.Text(consumer), consumer}, &c.Parked, &c.Retrying)
	return c, b.Wrap(err)
}

// FindFailed implements driver.Dialect.
func (b *Base) FindFailed(ctx context.Context, ex driver.Executor, consumer string, id uuid.UUID, body []byte) (int64, error) {
	found, err := FindFailed(ctx, ex, b.spec.Failed.Find, consumer, id, body)
	return found, b.Wrap(err)
}

// GetFailed implements driver.Dialect.
func (b *Base) GetFailed(ctx context.Context, ex driver.Executor, id int64) (idem.FailedMessage, error) {
	m, err := GetFailed(ctx, ex, b.spec.Failed.Get, []any{id}, b.spec.Failed.Time)
	return m, b.Wrap(err)
}

// DeleteFailed implements driver.Dialect.
func (b *Base) DeleteFailed(ctx context.Context, ex driver.Executor, id int64) (bool, error) {
	n, err := ex.Exec(ctx, b.spec.Failed.Delete, id)
	return n == 1, b.Wrap(err)
}

// HasParkedAggregates implements driver.Dialect.
func (b *Base) HasParkedAggregates(ctx context.Context, ex driver.Executor, consumer string) (bool, error) {
	var ok bool
	err := driver.QueryRow(ctx, ex, b.spec.Failed.HasParked, []any{failrow.Text(consumer)}, &ok)
	return ok, b.Wrap(err)
}

// Must returns d, or panics with err: the MustDialect of every dialect, for
// table names known to be valid.
func Must[D any](d D, err error) D {
	if err != nil {
		panic(err)
	}
	return d
}

// NewSQL returns a database/sql driver on db with the dialect newDialect
// returns for tables: the NewTables of every dialect.
func NewSQL(db *sql.DB, tables idem.Tables, newDialect func(idem.Tables) (driver.Dialect, error)) (*driver.SQLDriver, error) {
	d, err := newDialect(tables)
	if err != nil {
		return nil, err
	}
	return driver.NewSQL(db, d), nil
}
