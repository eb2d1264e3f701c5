package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/failrow"
	"github.com/idem-go/idem/driver/internal/sqlrelay"
	"github.com/idem-go/idem/driver/internal/sqltime"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Dialect is the SQLite dialect bound to a set of table names.
type Dialect struct {
	tables     idem.Tables
	q          queries
	rq         *sqlrelay.Relay
	status     dialectkit.StatusSQL
	group      *dialectkit.GroupSQL
	migrations []driver.Migration
	support    driver.MigrationSupport
}

var _ driver.Dialect = (*Dialect)(nil)

// NewDialect returns the SQLite dialect for tables (zero value: defaults).
// SQLite has no schemas: Tables.Schema must be empty.
func NewDialect(tables idem.Tables) (*Dialect, error) {
	if tables.Schema != "" {
		return nil, fmt.Errorf("idem: sqlite: Tables.Schema %q: SQLite has no schemas; leave it empty and use one database file per schema", tables.Schema)
	}
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	t := tables.WithDefaults()
	d := &Dialect{tables: t}
	names := struct {
		Outbox, ProcessedEvent, FailedMessage, DeliveryAttempt                 string
		OutboxName, ProcessedEventName, FailedMessageName, DeliveryAttemptName string
		IdempotentRequest, IdempotentRequestName                               string
		ConsumerMember, ConsumerMemberName                                     string
		ConsumerPartition, ConsumerPartitionName                               string
	}{
		Outbox:                QuoteIdent(t.Outbox),
		ProcessedEvent:        QuoteIdent(t.ProcessedEvent),
		FailedMessage:         QuoteIdent(t.FailedMessage),
		DeliveryAttempt:       QuoteIdent(t.DeliveryAttempt),
		OutboxName:            t.Outbox,
		ProcessedEventName:    t.ProcessedEvent,
		FailedMessageName:     t.FailedMessage,
		DeliveryAttemptName:   t.DeliveryAttempt,
		IdempotentRequest:     QuoteIdent(t.IdempotentRequest),
		IdempotentRequestName: t.IdempotentRequest,
		ConsumerMember:        QuoteIdent(t.ConsumerMember),
		ConsumerMemberName:    t.ConsumerMember,
		ConsumerPartition:     QuoteIdent(t.ConsumerPartition),
		ConsumerPartitionName: t.ConsumerPartition,
	}
	funcs := template.FuncMap{"ident": func(parts ...string) string { return QuoteIdent(strings.Join(parts, "_")) }}
	migs, err := dialectkit.LoadMigrations(migrationFiles, "migrations", names, funcs)
	if err != nil {
		return nil, err
	}
	d.migrations = migs
	d.q = newQueries(names.Outbox, names.ProcessedEvent, names.FailedMessage, names.DeliveryAttempt)
	d.rq = newRelay(names.Outbox, d.wrap)
	d.status = newStatusSQL(names.Outbox, names.ProcessedEvent, names.FailedMessage, names.DeliveryAttempt)
	d.group = newGroupSQL(names.ConsumerMember, names.ConsumerPartition, d.wrap)
	mt := QuoteIdent(t.Migrations)
	d.support = driver.MigrationSupport{
		CreateTable: "CREATE TABLE IF NOT EXISTS " + mt + ` (
    version    INTEGER NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
)`,
		// No lock statement: the migration transaction is IMMEDIATE (Open
		// sets _txlock=immediate), so it holds the write lock from its start
		// and concurrent migrators run one after the other.
		SelectVersions:   "SELECT version FROM " + mt + " ORDER BY version",
		InsertVersion:    "INSERT INTO " + mt + " (version, name) VALUES (?, ?)",
		DeleteVersion:    "DELETE FROM " + mt + " WHERE version = ?",
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

// New returns a database/sql driver on db (opened with Open) with the
// default table names.
func New(db *sql.DB) *driver.SQLDriver {
	return driver.NewSQL(db, MustDialect(idem.Tables{}))
}

// NewTables is New with configured table names.
func NewTables(db *sql.DB, tables idem.Tables) (*driver.SQLDriver, error) {
	d, err := NewDialect(tables)
	if err != nil {
		return nil, err
	}
	return driver.NewSQL(db, d), nil
}

// QuoteIdent quotes an SQL identifier for SQLite.
func QuoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// Name implements driver.Dialect.
func (d *Dialect) Name() string { return "sqlite" }

// Tables implements driver.Dialect.
func (d *Dialect) Tables() idem.Tables { return d.tables }

// Migrations implements driver.Dialect.
func (d *Dialect) Migrations() []driver.Migration { return d.migrations }

// MigrationSupport implements driver.Dialect.
func (d *Dialect) MigrationSupport() driver.MigrationSupport { return d.support }

// OutboxTable returns the quoted outbox table name.
func (d *Dialect) OutboxTable() string { return QuoteIdent(d.tables.Outbox) }

// InsertOutbox implements driver.Dialect.
func (d *Dialect) InsertOutbox(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow) error {
	return d.wrap(dialectkit.InsertOutboxRows(ctx, ex, rows, d.q.insertOutbox, func(r driver.OutboxRow, payload any, headers string) []any {
		return []any{r.ID.String(), r.AggregateType, r.AggregateID, r.Type, payload, sqltime.Format(r.OccurredAt), r.AggregateVersion, headers}
	}))
}

// MarkProcessed implements driver.Dialect with INSERT ... ON CONFLICT
// (consumer_name, event_id) DO NOTHING, which skips that key's conflicts
// only.
func (d *Dialect) MarkProcessed(ctx context.Context, ex driver.Executor, consumer string, marks []driver.Mark) ([]bool, error) {
	inserted := make([]bool, len(marks))
	if len(marks) == 1 {
		n, err := ex.Exec(ctx, d.q.markProcessedOne, consumer, marks[0].ID.String(), hashArg(marks[0].Hash))
		if err != nil {
			return nil, d.wrap(err)
		}
		inserted[0] = n == 1
		return inserted, nil
	}
	for start := 0; start < len(marks); start += chunk {
		part := marks[start:min(len(marks), start+chunk)]
		args := make([]any, 0, 3*len(part))
		index := make(map[string]int, len(part))
		for i, m := range part {
			s := m.ID.String()
			args = append(args, consumer, s, hashArg(m.Hash))
			index[s] = start + i
		}
		err := driver.QueryRows(ctx, ex, d.q.markProcessedMany(len(part)), args, func(rows driver.Rows) error {
			var id string
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
	}
	return inserted, nil
}

// chunk is the most ids or aggregates one statement carries (3 parameters
// each stays below SQLite's limit of 32766).
const chunk = 1000

// hashArg is a payload hash as stored: NULL for 0 (unknown).
func hashArg(h int64) any {
	if h == 0 {
		return nil
	}
	return h
}

func uuidArgs(ids []uuid.UUID) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// ProcessedHashes implements driver.Dialect.
func (d *Dialect) ProcessedHashes(ctx context.Context, ex driver.Executor, consumer string, ids []uuid.UUID) (map[uuid.UUID]int64, error) {
	out := map[uuid.UUID]int64{}
	for start := 0; start < len(ids); start += chunk {
		part := ids[start:min(len(ids), start+chunk)]
		err := driver.QueryRows(ctx, ex, d.q.processedHashes(len(part)), append([]any{consumer}, uuidArgs(part)...), func(rows driver.Rows) error {
			var (
				id   string
				hash int64
			)
			if err := rows.Scan(&id, &hash); err != nil {
				return err
			}
			u, err := uuid.Parse(id)
			if err != nil {
				return fmt.Errorf("idem: processed_event: event_id %q: %w", id, err)
			}
			out[u] = hash
			return nil
		})
		if err != nil {
			return nil, d.wrap(err)
		}
	}
	return out, nil
}

// PurgeProcessed implements driver.Dialect.
func (d *Dialect) PurgeProcessed(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeProcessed, sqltime.Format(before), consumer, consumer, limit)
	return n, d.wrap(err)
}

// RecordAttempt implements driver.Dialect with INSERT ... ON CONFLICT DO
// UPDATE ... RETURNING; SQLite runs writers one at a time.
func (d *Dialect) RecordAttempt(ctx context.Context, ex driver.Executor, consumer string, id uuid.UUID, errText string) (int, error) {
	var n int
	err := driver.QueryRow(ctx, ex, d.q.recordAttempt, []any{consumer, id.String(), failrow.Text(errText)}, &n)
	return n, d.wrap(err)
}

// ClearAttempts implements driver.Dialect.
func (d *Dialect) ClearAttempts(ctx context.Context, ex driver.Executor, consumer string, ids []uuid.UUID) error {
	for start := 0; start < len(ids); start += chunk {
		part := ids[start:min(len(ids), start+chunk)]
		if _, err := ex.Exec(ctx, d.q.clearAttempts(len(part)), append([]any{consumer}, uuidArgs(part)...)...); err != nil {
			return d.wrap(err)
		}
	}
	return nil
}

// PurgeAttempts implements driver.Dialect.
func (d *Dialect) PurgeAttempts(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeAttempts, sqltime.Format(before), consumer, consumer, limit)
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
		err = driver.QueryRow(ctx, ex, d.q.updateFailed, []any{r.Error, r.Entry, r.Attempts, r.HeldBy, m.ID, r.Consumer}, &id)
		if !errors.Is(err, idem.ErrNotFound) {
			return id, d.wrap(err)
		}
	}
	err = driver.QueryRow(ctx, ex, d.q.insertFailed,
		[]any{r.Consumer, r.Source, r.EventID, r.EventName, r.Key, r.Headers, r.Body, r.Error,
			"[" + r.Entry + "]", r.Attempts, r.AggregateType, r.AggregateID, r.HeldBy},
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
		return nil, fmt.Errorf("idem: sqlite: ListFailed: Limit %d: want a positive page size", f.Limit)
	}
	f = failrow.Filter(f)
	since := sqltime.Arg(f.Since)
	heldBy, before, after := max(f.HeldBy, 0), max(f.BeforeID, 0), max(f.AfterID, 0)
	query := d.q.listFailedNewest
	if f.Oldest {
		query = d.q.listFailedOldest
	}
	list, err := dialectkit.QueryFailed(ctx, ex, query, []any{f.Consumer, f.Consumer, f.EventName, f.EventName,
		f.AggregateType, f.AggregateType, f.AggregateID, f.AggregateID, heldBy, heldBy, since, since,
		before, before, after, after, f.Limit}, sqltimeDest)
	return list, d.wrap(err)
}

// GetFailed implements driver.Dialect.
func (d *Dialect) GetFailed(ctx context.Context, ex driver.Executor, id int64) (idem.FailedMessage, error) {
	m, err := dialectkit.GetFailed(ctx, ex, d.q.getFailed, []any{id}, sqltimeDest)
	return m, d.wrap(err)
}

// DeleteFailed implements driver.Dialect.
func (d *Dialect) DeleteFailed(ctx context.Context, ex driver.Executor, id int64) (bool, error) {
	n, err := ex.Exec(ctx, d.q.deleteFailed, id)
	return n == 1, d.wrap(err)
}

// PurgeFailed implements driver.Dialect.
func (d *Dialect) PurgeFailed(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	consumer = failrow.Text(consumer)
	n, err := ex.Exec(ctx, d.q.purgeFailed, sqltime.Format(before), consumer, consumer, limit)
	return n, d.wrap(err)
}

// ParkedAggregates implements driver.Dialect, in one statement per 1000
// aggregates.
func (d *Dialect) ParkedAggregates(ctx context.Context, ex driver.Executor, consumer string, aggs []idem.AggregateRef) (map[idem.AggregateRef]int64, error) {
	out, err := failrow.ParkedAggregates(ctx, ex, consumer, aggs, chunk, d.q.parkedAggregates)
	return out, d.wrap(err)
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
	return err != nil && strings.Contains(err.Error(), "no such table")
}

// IsBusy reports whether err is SQLite's "database is locked" (SQLITE_BUSY):
// the busy timeout ran out while another connection held the write lock.
func IsBusy(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "database is locked") || strings.Contains(err.Error(), "SQLITE_BUSY"))
}

// wrap adds the "run idem migrate" hint to missing-table errors.
func (d *Dialect) wrap(err error) error {
	if err == nil {
		return nil
	}
	if d.IsMissingTable(err) && !errors.Is(err, idem.ErrMissingTable) {
		return fmt.Errorf("%w (%v)", idem.ErrMissingTable, err)
	}
	return err
}

// sqltimeDest scans failure-store timestamps stored as UTC.
func sqltimeDest(t *time.Time) any { return sqltime.Scanner(t) }
