// Package postgres is idem's PostgreSQL dialect, with drivers for pgx v5
// (NewPgx, transactions of type pgx.Tx) and database/sql (NewSQL, *sql.Tx with
// the pgx stdlib driver). All of its SQL is in this package: migrations in
// migrations/*.sql, queries in queries.go.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/failrow"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Dialect is the PostgreSQL dialect bound to a set of table names.
type Dialect struct {
	tables     idem.Tables
	q          queries
	rq         relayQueries
	status     dialectkit.StatusSQL
	group      *dialectkit.GroupSQL
	migrations []driver.Migration
	support    driver.MigrationSupport
}

var _ driver.Dialect = (*Dialect)(nil)

// NewDialect returns the PostgreSQL dialect for tables (zero value: defaults).
func NewDialect(tables idem.Tables) (*Dialect, error) {
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	t := tables.WithDefaults()
	d := &Dialect{tables: t}
	names := struct {
		Outbox, ProcessedEvent, FailedMessage, DeliveryAttempt, NotifyFunc     string
		OutboxName, ProcessedEventName, FailedMessageName, DeliveryAttemptName string
		IdempotentRequest, IdempotentRequestName                               string
		ConsumerMember, ConsumerMemberName                                     string
		ConsumerPartition, ConsumerPartitionName                               string
	}{
		Outbox:                d.qualify(t.Outbox),
		ProcessedEvent:        d.qualify(t.ProcessedEvent),
		FailedMessage:         d.qualify(t.FailedMessage),
		DeliveryAttempt:       d.qualify(t.DeliveryAttempt),
		NotifyFunc:            d.qualify(t.Outbox + "_notify"),
		OutboxName:            t.Outbox,
		ProcessedEventName:    t.ProcessedEvent,
		FailedMessageName:     t.FailedMessage,
		DeliveryAttemptName:   t.DeliveryAttempt,
		IdempotentRequest:     d.qualify(t.IdempotentRequest),
		IdempotentRequestName: t.IdempotentRequest,
		ConsumerMember:        d.qualify(t.ConsumerMember),
		ConsumerMemberName:    t.ConsumerMember,
		ConsumerPartition:     d.qualify(t.ConsumerPartition),
		ConsumerPartitionName: t.ConsumerPartition,
	}
	funcs := template.FuncMap{"ident": func(parts ...string) string { return QuoteIdent(strings.Join(parts, "_")) }}
	migs, err := dialectkit.LoadMigrations(migrationFiles, "migrations", names, funcs)
	if err != nil {
		return nil, err
	}
	d.migrations = migs
	d.q = newQueries(names.Outbox, names.ProcessedEvent, names.FailedMessage, names.DeliveryAttempt)
	d.rq = newRelayQueries(names.Outbox)
	d.status = newStatusSQL(names.Outbox, names.ProcessedEvent, names.FailedMessage, names.DeliveryAttempt)
	d.group = newGroupSQL(names.ConsumerMember, names.ConsumerPartition, d.wrap)
	mt := d.qualify(t.Migrations)
	d.support = driver.MigrationSupport{
		CreateTable: "CREATE TABLE IF NOT EXISTS " + mt + ` (
    version    integer     NOT NULL PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`,
		// One lock id for every idem migrator on this database.
		Lock:             "SELECT pg_advisory_xact_lock(7193453042189)",
		SelectVersions:   "SELECT version FROM " + mt + " ORDER BY version",
		InsertVersion:    "INSERT INTO " + mt + " (version, name) VALUES ($1, $2)",
		DeleteVersion:    "DELETE FROM " + mt + " WHERE version = $1",
		TransactionalDDL: true,
	}
	return d, nil
}

// MustDialect is NewDialect for table names known to be valid.
func MustDialect(tables idem.Tables) *Dialect {
	d, err := NewDialect(tables)
	if err != nil {
		panic(err)
	}
	return d
}

// QuoteIdent quotes an SQL identifier for PostgreSQL.
func QuoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

func (d *Dialect) qualify(name string) string {
	if d.tables.Schema == "" {
		return QuoteIdent(name)
	}
	return QuoteIdent(d.tables.Schema) + "." + QuoteIdent(name)
}

// Name implements driver.Dialect.
func (d *Dialect) Name() string { return "postgres" }

// Tables implements driver.Dialect.
func (d *Dialect) Tables() idem.Tables { return d.tables }

// Migrations implements driver.Dialect.
func (d *Dialect) Migrations() []driver.Migration { return d.migrations }

// MigrationSupport implements driver.Dialect.
func (d *Dialect) MigrationSupport() driver.MigrationSupport { return d.support }

// OutboxChannel returns the LISTEN channel the outbox trigger notifies:
// "<schema>.<table>", where schema is the configured one or, when empty,
// currentSchema (the connection's current_schema()).
func (d *Dialect) OutboxChannel(currentSchema string) string {
	s := d.tables.Schema
	if s == "" {
		s = currentSchema
	}
	return s + "." + d.tables.Outbox
}

// OutboxTable returns the quoted, qualified outbox table name.
func (d *Dialect) OutboxTable() string { return d.qualify(d.tables.Outbox) }

// InsertOutbox implements driver.Dialect.
func (d *Dialect) InsertOutbox(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow) error {
	return d.wrap(dialectkit.InsertOutboxRows(ctx, ex, rows, d.q.insertOutbox, func(r driver.OutboxRow, payload any, headers string) []any {
		return []any{r.ID, r.AggregateType, r.AggregateID, r.Type, payload, r.OccurredAt, r.AggregateVersion, headers}
	}))
}

// MarkProcessed implements driver.Dialect.
func (d *Dialect) MarkProcessed(ctx context.Context, ex driver.Executor, consumer string, marks []driver.Mark) ([]bool, error) {
	inserted := make([]bool, len(marks))
	if len(marks) == 0 {
		return inserted, nil
	}
	if len(marks) == 1 {
		n, err := ex.Exec(ctx, d.q.markProcessedOne, consumer, marks[0].ID, marks[0].Hash)
		if err != nil {
			return nil, d.wrap(err)
		}
		inserted[0] = n == 1
		return inserted, nil
	}
	ids := make([]string, len(marks))
	hashes := make([]int64, len(marks))
	index := make(map[uuid.UUID]int, len(marks))
	for i, m := range marks {
		ids[i], hashes[i] = m.ID.String(), m.Hash
		index[m.ID] = i
	}
	err := driver.QueryRows(ctx, ex, d.q.markProcessedMany, []any{consumer, ids, hashes}, func(rows driver.Rows) error {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return err
		}
		if i, ok := index[id]; ok {
			inserted[i] = true
		}
		return nil
	})
	if err != nil {
		return nil, d.wrap(err)
	}
	return inserted, nil
}

// ProcessedHashes implements driver.Dialect.
func (d *Dialect) ProcessedHashes(ctx context.Context, ex driver.Executor, consumer string, ids []uuid.UUID) (map[uuid.UUID]int64, error) {
	out := map[uuid.UUID]int64{}
	if len(ids) == 0 {
		return out, nil
	}
	err := driver.QueryRows(ctx, ex, d.q.processedHashes, []any{consumer, uuidStrings(ids)}, func(rows driver.Rows) error {
		var (
			id   uuid.UUID
			hash int64
		)
		if err := rows.Scan(&id, &hash); err != nil {
			return err
		}
		out[id] = hash
		return nil
	})
	if err != nil {
		return nil, d.wrap(err)
	}
	return out, nil
}

// PurgeProcessed implements driver.Dialect.
func (d *Dialect) PurgeProcessed(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeProcessed, before, consumer, limit)
	return n, d.wrap(err)
}

// RecordAttempt implements driver.Dialect with INSERT ... ON CONFLICT DO
// UPDATE, which counts concurrent calls one after the other.
func (d *Dialect) RecordAttempt(ctx context.Context, ex driver.Executor, consumer string, id uuid.UUID, errText string) (int, error) {
	var n int
	err := driver.QueryRow(ctx, ex, d.q.recordAttempt, []any{consumer, id, failrow.Text(errText)}, &n)
	return n, d.wrap(err)
}

// ClearAttempts implements driver.Dialect.
func (d *Dialect) ClearAttempts(ctx context.Context, ex driver.Executor, consumer string, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := ex.Exec(ctx, d.q.clearAttempts, consumer, uuidStrings(ids))
	return d.wrap(err)
}

// PurgeAttempts implements driver.Dialect.
func (d *Dialect) PurgeAttempts(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeAttempts, before, consumer, limit)
	return n, d.wrap(err)
}

// SaveFailed implements driver.Dialect.
func (d *Dialect) SaveFailed(ctx context.Context, ex driver.Executor, m idem.FailedMessage) (int64, error) {
	r, err := failrow.Encode(m, time.Now())
	if err != nil {
		return 0, err
	}
	var id int64
	if m.ID != 0 {
		err = driver.QueryRow(ctx, ex, d.q.updateFailed, []any{m.ID, r.Consumer, r.Error, r.Attempts, r.HeldBy}, &id)
		if !errors.Is(err, idem.ErrNotFound) {
			return id, d.wrap(err)
		}
	}
	err = driver.QueryRow(ctx, ex, d.q.insertFailed,
		[]any{r.Consumer, r.Source, r.EventID, r.EventName, r.Key, r.Headers, r.Body, r.Error, r.Attempts,
			r.AggregateType, r.AggregateID, r.HeldBy},
		&id)
	return id, d.wrap(err)
}

// FindFailed implements driver.Dialect.
func (d *Dialect) FindFailed(ctx context.Context, ex driver.Executor, consumer string, id uuid.UUID, body []byte) (int64, error) {
	found, err := dialectkit.FindFailed(ctx, ex, d.q.findFailed, consumer, id, body)
	return found, d.wrap(err)
}

// ListFailed implements driver.Dialect.
func (d *Dialect) ListFailed(ctx context.Context, ex driver.Executor, f idem.FailedFilter) ([]idem.FailedMessage, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("idem: postgres: ListFailed: Limit %d: want a positive page size", f.Limit)
	}
	f = failrow.Filter(f)
	var since any
	if !f.Since.IsZero() {
		since = f.Since
	}
	query := d.q.listFailedNewest
	if f.Oldest {
		query = d.q.listFailedOldest
	}
	list, err := dialectkit.QueryFailed(ctx, ex, query, []any{f.Consumer, f.EventName, f.AggregateType, f.AggregateID,
		max(f.HeldBy, 0), since, max(f.BeforeID, 0), max(f.AfterID, 0), f.Limit}, nil)
	return list, d.wrap(err)
}

// GetFailed implements driver.Dialect.
func (d *Dialect) GetFailed(ctx context.Context, ex driver.Executor, id int64) (idem.FailedMessage, error) {
	m, err := dialectkit.GetFailed(ctx, ex, d.q.getFailed, []any{id}, nil)
	return m, d.wrap(err)
}

// DeleteFailed implements driver.Dialect.
func (d *Dialect) DeleteFailed(ctx context.Context, ex driver.Executor, id int64) (bool, error) {
	n, err := ex.Exec(ctx, d.q.deleteFailed, id)
	return n == 1, d.wrap(err)
}

// PurgeFailed implements driver.Dialect.
func (d *Dialect) PurgeFailed(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeFailed, before, failrow.Text(consumer), limit)
	return n, d.wrap(err)
}

// ParkedAggregates implements driver.Dialect in one statement.
func (d *Dialect) ParkedAggregates(ctx context.Context, ex driver.Executor, consumer string, aggs []idem.AggregateRef) (map[idem.AggregateRef]int64, error) {
	out := map[idem.AggregateRef]int64{}
	types, ids, back := failrow.Aggregates(aggs)
	if len(types) == 0 {
		return out, nil
	}
	err := driver.QueryRows(ctx, ex, d.q.parkedAggregates, []any{failrow.Text(consumer), types, ids}, failrow.ScanParked(out, back))
	if err != nil {
		return nil, d.wrap(err)
	}
	return out, nil
}

// HasParkedAggregates implements driver.Dialect.
func (d *Dialect) HasParkedAggregates(ctx context.Context, ex driver.Executor, consumer string) (bool, error) {
	var ok bool
	err := driver.QueryRow(ctx, ex, d.q.hasParkedAggregates, []any{failrow.Text(consumer)}, &ok)
	return ok, d.wrap(err)
}

// IsTransient implements driver.Dialect (see the package function
// IsTransient).
func (d *Dialect) IsTransient(err error) bool { return IsTransient(err) }

// IsMissingTable implements driver.Dialect.
func (d *Dialect) IsMissingTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// IsUniqueViolation reports whether err is a unique violation, on constraint
// when it is not empty.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && (constraint == "" || pgErr.ConstraintName == constraint)
}

// wrap adds the "run idem migrate" hint to missing-table errors.
func (d *Dialect) wrap(err error) error {
	if err == nil {
		return nil
	}
	if d.IsMissingTable(err) {
		return fmt.Errorf("%w (%v)", idem.ErrMissingTable, err)
	}
	return err
}

func uuidStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}
