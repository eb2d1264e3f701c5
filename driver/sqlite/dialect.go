package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/sqlrelay"
	"github.com/idem-go/idem/driver/internal/sqltime"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Dialect is the SQLite dialect bound to a set of table names.
type Dialect struct {
	tables     driver.Tables
	q          queries
	rq         *sqlrelay.Relay
	migrations []driver.Migration
	support    driver.MigrationSupport
}

var _ driver.Dialect = (*Dialect)(nil)

// NewDialect returns the SQLite dialect for tables (zero value: defaults).
// SQLite has no schemas: Tables.Schema must be empty.
func NewDialect(tables driver.Tables) (*Dialect, error) {
	if tables.Schema != "" {
		return nil, fmt.Errorf("idem: sqlite: Tables.Schema %q: SQLite has no schemas; leave it empty and use one database file per schema", tables.Schema)
	}
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	t := tables.WithDefaults()
	d := &Dialect{tables: t}
	names := struct {
		Outbox, ProcessedEvent, FailedMessage             string
		OutboxName, ProcessedEventName, FailedMessageName string
	}{
		Outbox:             QuoteIdent(t.Outbox),
		ProcessedEvent:     QuoteIdent(t.ProcessedEvent),
		FailedMessage:      QuoteIdent(t.FailedMessage),
		OutboxName:         t.Outbox,
		ProcessedEventName: t.ProcessedEvent,
		FailedMessageName:  t.FailedMessage,
	}
	funcs := template.FuncMap{"ident": func(parts ...string) string { return QuoteIdent(strings.Join(parts, "_")) }}
	migs, err := driver.LoadMigrations(migrationFiles, "migrations", names, funcs)
	if err != nil {
		return nil, err
	}
	d.migrations = migs
	d.q = newQueries(names.Outbox, names.ProcessedEvent, names.FailedMessage)
	d.rq = newRelay(names.Outbox, d.wrap)
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
func MustDialect(tables driver.Tables) *Dialect {
	d, err := NewDialect(tables)
	if err != nil {
		panic(err)
	}
	return d
}

// New returns a database/sql driver on db (opened with Open) with the
// default table names.
func New(db *sql.DB) *driver.SQLDriver {
	return driver.NewSQL(db, MustDialect(driver.Tables{}))
}

// NewTables is New with configured table names.
func NewTables(db *sql.DB, tables driver.Tables) (*driver.SQLDriver, error) {
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
func (d *Dialect) Tables() driver.Tables { return d.tables }

// Migrations implements driver.Dialect.
func (d *Dialect) Migrations() []driver.Migration { return d.migrations }

// MigrationSupport implements driver.Dialect.
func (d *Dialect) MigrationSupport() driver.MigrationSupport { return d.support }

// OutboxTable returns the quoted outbox table name.
func (d *Dialect) OutboxTable() string { return QuoteIdent(d.tables.Outbox) }

// InsertOutbox implements driver.Dialect.
func (d *Dialect) InsertOutbox(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow) error {
	return d.wrap(driver.InsertOutboxRows(ctx, ex, rows, d.q.insertOutbox, func(r driver.OutboxRow, payload any, headers string) []any {
		return []any{r.ID.String(), r.AggregateType, r.AggregateID, r.Type, payload, sqltime.Format(r.OccurredAt), r.AggregateVersion, headers}
	}))
}

// MarkProcessed implements driver.Dialect with INSERT ... ON CONFLICT
// (consumer_name, event_id) DO NOTHING, which skips that key's conflicts
// only.
func (d *Dialect) MarkProcessed(ctx context.Context, ex driver.Executor, consumer string, ids []uuid.UUID) ([]bool, error) {
	inserted := make([]bool, len(ids))
	if len(ids) == 1 {
		n, err := ex.Exec(ctx, d.q.markProcessedOne, consumer, ids[0].String())
		if err != nil {
			return nil, d.wrap(err)
		}
		inserted[0] = n == 1
		return inserted, nil
	}
	for start := 0; start < len(ids); start += 1000 {
		chunk := ids[start:min(len(ids), start+1000)]
		args := make([]any, 0, 2*len(chunk))
		index := make(map[string]int, len(chunk))
		for i, id := range chunk {
			s := id.String()
			args = append(args, consumer, s)
			index[s] = start + i
		}
		err := driver.QueryRows(ctx, ex, d.q.markProcessedMany(len(chunk)), args, func(rows driver.Rows) error {
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

// PurgeProcessed implements driver.Dialect.
func (d *Dialect) PurgeProcessed(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeProcessed, sqltime.Format(before), consumer, consumer, limit)
	return n, d.wrap(err)
}

// SaveFailed implements driver.Dialect.
func (d *Dialect) SaveFailed(ctx context.Context, ex driver.Executor, m driver.FailedMessage) (int64, error) {
	headers, err := json.Marshal(nonNil(m.Headers))
	if err != nil {
		return 0, err
	}
	entry, err := json.Marshal(driver.FailureRecord{At: time.Now().UTC(), Attempt: m.Attempts, Error: m.Error})
	if err != nil {
		return 0, err
	}
	var eventID any
	if m.EventID != uuid.Nil {
		eventID = m.EventID.String()
	}
	body := m.Body
	if body == nil {
		body = []byte{}
	}
	var id int64
	err = driver.QueryRow(ctx, ex, d.q.saveFailed,
		[]any{m.Consumer, m.Source, eventID, m.EventName, m.Key, string(headers), body, m.Error,
			"[" + string(entry) + "]", m.Attempts, string(entry)},
		&id)
	return id, d.wrap(err)
}

// ListFailed implements driver.Dialect.
func (d *Dialect) ListFailed(ctx context.Context, ex driver.Executor, f driver.FailedFilter) ([]driver.FailedMessage, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	since := sqltime.Arg(f.Since)
	list, err := driver.QueryFailed(ctx, ex, d.q.listFailed, []any{f.Consumer, f.Consumer, f.EventName, f.EventName, since, since, limit}, sqltimeDest)
	return list, d.wrap(err)
}

// GetFailed implements driver.Dialect.
func (d *Dialect) GetFailed(ctx context.Context, ex driver.Executor, id int64) (driver.FailedMessage, error) {
	m, err := driver.GetFailed(ctx, ex, d.q.getFailed, []any{id}, sqltimeDest)
	return m, d.wrap(err)
}

// DeleteFailed implements driver.Dialect.
func (d *Dialect) DeleteFailed(ctx context.Context, ex driver.Executor, id int64) (bool, error) {
	n, err := ex.Exec(ctx, d.q.deleteFailed, id)
	return n == 1, d.wrap(err)
}

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
	if d.IsMissingTable(err) && !errors.Is(err, driver.ErrMissingTable) {
		return fmt.Errorf("%w (%v)", driver.ErrMissingTable, err)
	}
	return err
}

func nonNil(h map[string]string) map[string]string {
	if h == nil {
		return map[string]string{}
	}
	return h
}

// sqltimeDest scans failure-store timestamps stored as UTC.
func sqltimeDest(t *time.Time) any { return sqltime.Scanner(t) }
