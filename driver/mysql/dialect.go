package mysql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/failrow"
	"github.com/idem-go/idem/driver/internal/sqlbase"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MySQL and MariaDB error numbers the dialect recognises.
const (
	errDupEntry    = 1062 // ER_DUP_ENTRY
	errNoSuchTable = 1146 // ER_NO_SUCH_TABLE
)

// dialect is the MySQL/MariaDB dialect bound to a set of table names: the
// statements it shares with SQLite (sqlbase), and its own.
type dialect struct {
	*sqlbase.Dialect
	aq archiveQueries
}

// NewDialect returns the MySQL dialect for tables (zero value: defaults).
// Tables.Schema names the database holding the tables; empty means the
// connection's current database.
func NewDialect(tables idem.Tables) (driver.Dialect, error) {
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	t := tables.WithDefaults()
	n := dialectkit.TableNames(t, QuoteIdent)
	f := flavor(n)
	f.Name, f.Tables, f.Names, f.Quote, f.Migrations = "mysql", t, n, QuoteIdent, migrationFiles
	f.IsMissingTable, f.IsTransient = isMissingTable, IsTransient
	// One lock per database holding the tables (lock names are at most 64
	// characters: hash the database's name).
	lockName := "CONCAT('idem.migrate.', MD5(CONCAT_WS('.', '" + t.Schema + "', DATABASE())))"
	f.MigrationSupport = driver.MigrationSupport{
		CreateTable: "CREATE TABLE IF NOT EXISTS " + n.Migrations + ` (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
		// A session lock, held across the DDL's implicit commits.
		Lock:             "SELECT GET_LOCK(" + lockName + ", 600)",
		Unlock:           "DO RELEASE_LOCK(" + lockName + ")",
		TransactionalDDL: false,
	}
	base, err := sqlbase.New(f)
	if err != nil {
		return nil, err
	}
	return &dialect{Dialect: base, aq: newArchiveQueries(n.Outbox, n.OutboxName, n.OutboxArchive)}, nil
}

// MustDialect is NewDialect for table names known to be valid.
func MustDialect(tables idem.Tables) driver.Dialect { return dialectkit.Must(NewDialect(tables)) }

// New returns a database/sql driver on db (opened with this package's Open or
// with a DSN from DSN) with the default table names.
func New(db *sql.DB) *driver.SQLDriver {
	return driver.NewSQL(db, MustDialect(idem.Tables{}))
}

// NewTables is New with configured table names.
func NewTables(db *sql.DB, tables idem.Tables) (*driver.SQLDriver, error) {
	return dialectkit.NewSQL(db, tables, NewDialect)
}

// QuoteIdent quotes an SQL identifier for MySQL.
func QuoteIdent(s string) string {
	return "`" + strings.ReplaceAll(s, "`", "``") + "`"
}

// MarkProcessed implements driver.Dialect. MySQL has no INSERT ... ON
// CONFLICT DO NOTHING that is limited to one key (INSERT IGNORE hides every
// error): the dialect inserts and recognises the duplicate-key error on the
// processed_event primary key (IsDuplicateKey). A failed statement does not
// abort an InnoDB transaction, so the transaction goes on. Marks are
// inserted in statements of up to 1000; if one of a statement's ids is a
// duplicate, that statement's marks are inserted one by one.
func (d *dialect) MarkProcessed(ctx context.Context, ex driver.Executor, consumer string, marks []driver.Mark) ([]bool, error) {
	inserted := make([]bool, len(marks))
	for start := 0; start < len(marks); start += sqlbase.Chunk {
		part := marks[start:min(len(marks), start+sqlbase.Chunk)]
		if len(part) > 1 {
			args := make([]any, 0, 3*len(part))
			for _, m := range part {
				args = append(args, consumer, m.ID.String(), sqlbase.HashArg(m.Hash))
			}
			_, err := ex.Exec(ctx, d.Flavor().MarkProcessedMany(len(part)), args...)
			if err == nil {
				for i := range part {
					inserted[start+i] = true
				}
				continue
			}
			if !d.isProcessedDuplicate(err) {
				return nil, d.Wrap(err)
			}
		}
		for i, m := range part {
			_, err := ex.Exec(ctx, d.Flavor().MarkProcessedOne, consumer, m.ID.String(), sqlbase.HashArg(m.Hash))
			switch {
			case err == nil:
				inserted[start+i] = true
			case d.isProcessedDuplicate(err):
			default:
				return nil, d.Wrap(err)
			}
		}
	}
	return inserted, nil
}

// isProcessedDuplicate reports whether err is the duplicate-key error on the
// processed_event primary key.
func (d *dialect) isProcessedDuplicate(err error) bool {
	return IsDuplicateKey(err, d.Tables().ProcessedEvent, "PRIMARY")
}

// RecordAttempt implements driver.Dialect with INSERT ... ON DUPLICATE KEY
// UPDATE, which InnoDB runs one after the other on the row. It needs the
// database/sql executor of a driver.SQLDriver, whose result carries the
// count.
func (d *dialect) RecordAttempt(ctx context.Context, ex driver.Executor, consumer string, id uuid.UUID, errText string) (int, error) {
	se, ok := ex.(driver.SQLExecutor)
	if !ok {
		return 0, fmt.Errorf("idem: mysql: RecordAttempt needs a database/sql executor, got %T", ex)
	}
	res, err := se.Q.ExecContext(ctx, d.Flavor().RecordAttempt, consumer, id.String(), failrow.Text(errText))
	if err != nil {
		return 0, d.Wrap(err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		// One row affected: inserted, the first attempt.
		return 1, err
	}
	n, err := res.LastInsertId()
	return int(n), err
}

// SaveFailed implements driver.Dialect. It needs the database/sql executor
// of a driver.SQLDriver, whose result carries the new row's id.
func (d *dialect) SaveFailed(ctx context.Context, ex driver.Executor, m idem.FailedMessage) (int64, error) {
	se, ok := ex.(driver.SQLExecutor)
	if !ok {
		return 0, fmt.Errorf("idem: mysql: SaveFailed needs a database/sql executor, got %T", ex)
	}
	r, err := failrow.Encode(m, time.Now())
	if err != nil {
		return 0, err
	}
	entry := "[" + r.Entry + "]"
	if m.ID != 0 {
		n, err := ex.Exec(ctx, d.Flavor().UpdateFailed, r.Error, entry, r.Attempts, r.HeldBy, m.ID, r.Consumer)
		if err != nil {
			return 0, d.Wrap(err)
		}
		if n > 0 {
			return m.ID, nil
		}
	}
	res, err := se.Q.ExecContext(ctx, d.Flavor().InsertFailed,
		r.Consumer, r.Source, r.EventID, r.EventName, r.Key, r.Headers, r.Body, r.Error, entry, r.Attempts,
		r.AggregateType, r.AggregateID, r.HeldBy)
	if err != nil {
		return 0, d.Wrap(err)
	}
	return res.LastInsertId()
}

// IsDuplicateKey reports whether err is a duplicate-key error (1062) on the
// index key of table (any index when key is empty). MariaDB names the index
// alone in the message ("for key 'PRIMARY'"), MySQL 8 prefixes it with the
// table ("for key 'processed_event.PRIMARY'"); both are recognised.
func IsDuplicateKey(err error, table, key string) bool {
	var myErr *gomysql.MySQLError
	if !errors.As(err, &myErr) || myErr.Number != errDupEntry {
		return false
	}
	if key == "" {
		return true
	}
	name, ok := duplicateKeyName(myErr.Message)
	if !ok {
		return false
	}
	return name == key || (table != "" && name == table+"."+key)
}

// duplicateKeyName extracts the index name from "Duplicate entry '…' for key
// 'name'".
func duplicateKeyName(msg string) (string, bool) {
	const marker = "for key '"
	i := strings.LastIndex(msg, marker)
	if i < 0 || !strings.HasSuffix(msg, "'") {
		return "", false
	}
	return msg[i+len(marker) : len(msg)-1], true
}

// isMissingTable reports whether err is ER_NO_SUCH_TABLE.
func isMissingTable(err error) bool {
	var myErr *gomysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == errNoSuchTable
}
