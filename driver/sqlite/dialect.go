package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/failrow"
	"github.com/idem-go/idem/driver/internal/sqlbase"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// dialect is the SQLite dialect bound to a set of table names: the
// statements it shares with MySQL (sqlbase), and its own.
type dialect struct{ *sqlbase.Dialect }

// NewDialect returns the SQLite dialect for tables (zero value: defaults).
// SQLite has no schemas: Tables.Schema must be empty.
func NewDialect(tables idem.Tables) (driver.Dialect, error) {
	if tables.Schema != "" {
		return nil, fmt.Errorf("idem: sqlite: Tables.Schema %q: SQLite has no schemas; leave it empty and use one database file per schema", tables.Schema)
	}
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	t := tables.WithDefaults()
	n := dialectkit.TableNames(t, QuoteIdent)
	f := flavor(n)
	f.Name, f.Tables, f.Names, f.Quote, f.Migrations = "sqlite", t, n, QuoteIdent, migrationFiles
	f.IsMissingTable, f.IsTransient = isMissingTable, IsTransient
	f.MigrationSupport = driver.MigrationSupport{
		CreateTable: "CREATE TABLE IF NOT EXISTS " + n.Migrations + ` (
    version    INTEGER NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
)`,
		// No lock statement: the migration transaction is IMMEDIATE (Open
		// sets _txlock=immediate), so it holds the write lock from its start
		// and concurrent migrators run one after the other.
		TransactionalDDL: true,
	}
	base, err := sqlbase.New(f)
	if err != nil {
		return nil, err
	}
	return &dialect{base}, nil
}

// MustDialect is NewDialect for table names known to be valid.
func MustDialect(tables idem.Tables) driver.Dialect { return dialectkit.Must(NewDialect(tables)) }

// New returns a database/sql driver on db (opened with Open) with the
// default table names.
func New(db *sql.DB) *driver.SQLDriver {
	return driver.NewSQL(db, MustDialect(idem.Tables{}))
}

// NewTables is New with configured table names.
func NewTables(db *sql.DB, tables idem.Tables) (*driver.SQLDriver, error) {
	return dialectkit.NewSQL(db, tables, NewDialect)
}

// QuoteIdent quotes an SQL identifier for SQLite.
func QuoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// MarkProcessed implements driver.Dialect with INSERT ... ON CONFLICT
// (consumer_name, event_id) DO NOTHING, which skips that key's conflicts
// only.
func (d *dialect) MarkProcessed(ctx context.Context, ex driver.Executor, consumer string, marks []driver.Mark) ([]bool, error) {
	inserted := make([]bool, len(marks))
	if len(marks) == 1 {
		n, err := ex.Exec(ctx, d.Flavor().MarkProcessedOne, consumer, marks[0].ID.String(), sqlbase.HashArg(marks[0].Hash))
		if err != nil {
			return nil, d.Wrap(err)
		}
		inserted[0] = n == 1
		return inserted, nil
	}
	for start := 0; start < len(marks); start += sqlbase.Chunk {
		part := marks[start:min(len(marks), start+sqlbase.Chunk)]
		args := make([]any, 0, 3*len(part))
		index := make(map[string]int, len(part))
		for i, m := range part {
			s := m.ID.String()
			args = append(args, consumer, s, sqlbase.HashArg(m.Hash))
			index[s] = start + i
		}
		err := driver.QueryRows(ctx, ex, d.Flavor().MarkProcessedMany(len(part)), args, func(rows driver.Rows) error {
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
			return nil, d.Wrap(err)
		}
	}
	return inserted, nil
}

// RecordAttempt implements driver.Dialect with INSERT ... ON CONFLICT DO
// UPDATE ... RETURNING; SQLite runs writers one at a time.
func (d *dialect) RecordAttempt(ctx context.Context, ex driver.Executor, consumer string, id uuid.UUID, errText string) (int, error) {
	var n int
	err := driver.QueryRow(ctx, ex, d.Flavor().RecordAttempt, []any{consumer, id.String(), failrow.Text(errText)}, &n)
	return n, d.Wrap(err)
}

// SaveFailed implements driver.Dialect.
func (d *dialect) SaveFailed(ctx context.Context, ex driver.Executor, m idem.FailedMessage) (int64, error) {
	r, err := failrow.Encode(m, time.Now())
	if err != nil {
		return 0, err
	}
	var id int64
	if m.ID != 0 {
		err = driver.QueryRow(ctx, ex, d.Flavor().UpdateFailed, []any{r.Error, r.Entry, r.Attempts, r.HeldBy, m.ID, r.Consumer}, &id)
		if !errors.Is(err, idem.ErrNotFound) {
			return id, d.Wrap(err)
		}
	}
	err = driver.QueryRow(ctx, ex, d.Flavor().InsertFailed,
		[]any{r.Consumer, r.Source, r.EventID, r.EventName, r.Key, r.Headers, r.Body, r.Error,
			"[" + r.Entry + "]", r.Attempts, r.AggregateType, r.AggregateID, r.HeldBy},
		&id)
	return id, d.Wrap(err)
}
