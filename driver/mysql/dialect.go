package mysql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/failrow"
	"github.com/idem-go/idem/driver/internal/sqltime"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MySQL and MariaDB error numbers the dialect recognises.
const (
	errDupEntry     = 1062 // ER_DUP_ENTRY
	errNoSuchTable  = 1146 // ER_NO_SUCH_TABLE
	errLockDeadlock = 1213 // ER_LOCK_DEADLOCK
)

// Dialect is the MySQL/MariaDB dialect bound to a set of table names.
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

// NewDialect returns the MySQL dialect for tables (zero value: defaults).
// Tables.Schema names the database holding the tables; empty means the
// connection's current database.
func NewDialect(tables idem.Tables) (*Dialect, error) {
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	t := tables.WithDefaults()
	d := &Dialect{tables: t}
	names := struct {
		Outbox, ProcessedEvent, FailedMessage, DeliveryAttempt, ClaimLock      string
		OutboxName, ProcessedEventName, FailedMessageName, DeliveryAttemptName string
		IdempotentRequest, IdempotentRequestName                               string
		ConsumerMember, ConsumerMemberName                                     string
		ConsumerPartition, ConsumerPartitionName                               string
	}{
		Outbox:                d.qualify(t.Outbox),
		ProcessedEvent:        d.qualify(t.ProcessedEvent),
		FailedMessage:         d.qualify(t.FailedMessage),
		DeliveryAttempt:       d.qualify(t.DeliveryAttempt),
		ClaimLock:             d.qualify(t.Outbox + "_claim_lock"),
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
	d.rq = newRelayQueries(names.Outbox, names.ClaimLock)
	d.status = newStatusSQL(names.Outbox, names.ProcessedEvent, names.FailedMessage, names.DeliveryAttempt)
	d.group = newGroupSQL(names.ConsumerMember, names.ConsumerPartition, wrapErr)
	mt := d.qualify(t.Migrations)
	// One lock per database holding the tables (lock names are at most 64
	// characters: hash the database's name).
	lockName := "CONCAT('idem.migrate.', MD5(CONCAT_WS('.', '" + t.Schema + "', DATABASE())))"
	d.support = driver.MigrationSupport{
		CreateTable: "CREATE TABLE IF NOT EXISTS " + mt + ` (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
		// A session lock, held across the DDL's implicit commits.
		Lock:             "SELECT GET_LOCK(" + lockName + ", 600)",
		Unlock:           "DO RELEASE_LOCK(" + lockName + ")",
		SelectVersions:   "SELECT version FROM " + mt + " ORDER BY version",
		InsertVersion:    "INSERT INTO " + mt + " (version, name) VALUES (?, ?)",
		DeleteVersion:    "DELETE FROM " + mt + " WHERE version = ?",
		TransactionalDDL: false,
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

// New returns a database/sql driver on db (opened with this package's Open or
// with a DSN from DSN) with the default table names.
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

// QuoteIdent quotes an SQL identifier for MySQL.
func QuoteIdent(s string) string {
	return "`" + strings.ReplaceAll(s, "`", "``") + "`"
}

func (d *Dialect) qualify(name string) string {
	if d.tables.Schema == "" {
		return QuoteIdent(name)
	}
	return QuoteIdent(d.tables.Schema) + "." + QuoteIdent(name)
}

// Name implements driver.Dialect.
func (d *Dialect) Name() string { return "mysql" }

// Tables implements driver.Dialect.
func (d *Dialect) Tables() idem.Tables { return d.tables }

// Migrations implements driver.Dialect.
func (d *Dialect) Migrations() []driver.Migration { return d.migrations }

// MigrationSupport implements driver.Dialect.
func (d *Dialect) MigrationSupport() driver.MigrationSupport { return d.support }

// OutboxTable returns the quoted, qualified outbox table name.
func (d *Dialect) OutboxTable() string { return d.qualify(d.tables.Outbox) }

// InsertOutbox implements driver.Dialect.
func (d *Dialect) InsertOutbox(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow) error {
	return d.wrap(dialectkit.InsertOutboxRows(ctx, ex, rows, d.q.insertOutbox, func(r driver.OutboxRow, payload any, headers string) []any {
		return []any{r.ID.String(), r.AggregateType, r.AggregateID, r.Type, payload, sqltime.Format(r.OccurredAt), r.AggregateVersion, headers}
	}))
}

// MarkProcessed implements driver.Dialect. MySQL has no INSERT ... ON
// CONFLICT DO NOTHING that is limited to one key (INSERT IGNORE hides every
// error): the dialect inserts and recognises the duplicate-key error on the
// processed_event primary key (IsDuplicateKey). A failed statement does not
// abort an InnoDB transaction, so the transaction goes on. Marks are
// inserted in statements of up to 1000; if one of a statement's ids is a
// duplicate, that statement's marks are inserted one by one.
func (d *Dialect) MarkProcessed(ctx context.Context, ex driver.Executor, consumer string, marks []driver.Mark) ([]bool, error) {
	inserted := make([]bool, len(marks))
	for start := 0; start < len(marks); start += chunk {
		part := marks[start:min(len(marks), start+chunk)]
		if len(part) > 1 {
			args := make([]any, 0, 3*len(part))
			for _, m := range part {
				args = append(args, consumer, m.ID.String(), hashArg(m.Hash))
			}
			_, err := ex.Exec(ctx, d.q.markProcessedMany(len(part)), args...)
			if err == nil {
				for i := range part {
					inserted[start+i] = true
				}
				continue
			}
			if !d.isProcessedDuplicate(err) {
				return nil, d.wrap(err)
			}
		}
		for i, m := range part {
			_, err := ex.Exec(ctx, d.q.markProcessedOne, consumer, m.ID.String(), hashArg(m.Hash))
			switch {
			case err == nil:
				inserted[start+i] = true
			case d.isProcessedDuplicate(err):
			default:
				return nil, d.wrap(err)
			}
		}
	}
	return inserted, nil
}

// chunk is the most ids or aggregates one statement carries.
const chunk = 1000

// hashArg is a payload hash as stored: NULL for 0 (unknown).
func hashArg(h int64) any {
	if h == 0 {
		return nil
	}
	return h
}

// ProcessedHashes implements driver.Dialect.
func (d *Dialect) ProcessedHashes(ctx context.Context, ex driver.Executor, consumer string, ids []uuid.UUID) (map[uuid.UUID]int64, error) {
	out := map[uuid.UUID]int64{}
	for start := 0; start < len(ids); start += chunk {
		part := ids[start:min(len(ids), start+chunk)]
		args := append([]any{consumer}, uuidArgs(part)...)
		err := driver.QueryRows(ctx, ex, d.q.processedHashes(len(part)), args, func(rows driver.Rows) error {
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

func uuidArgs(ids []uuid.UUID) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// isProcessedDuplicate reports whether err is the duplicate-key error on the
// processed_event primary key.
func (d *Dialect) isProcessedDuplicate(err error) bool {
	return IsDuplicateKey(err, d.tables.ProcessedEvent, "PRIMARY")
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

// PurgeProcessed implements driver.Dialect.
func (d *Dialect) PurgeProcessed(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeProcessed, sqltime.Format(before), consumer, consumer, limit)
	return n, d.wrap(err)
}

// RecordAttempt implements driver.Dialect with INSERT ... ON DUPLICATE KEY
// UPDATE, which InnoDB runs one after the other on the row. It needs the
// database/sql executor of a driver.SQLDriver, whose result carries the
// count.
func (d *Dialect) RecordAttempt(ctx context.Context, ex driver.Executor, consumer string, id uuid.UUID, errText string) (int, error) {
	se, ok := ex.(driver.SQLExecutor)
	if !ok {
		return 0, fmt.Errorf("idem: mysql: RecordAttempt needs a database/sql executor, got %T", ex)
	}
	res, err := se.Q.ExecContext(ctx, d.q.recordAttempt, consumer, id.String(), failrow.Text(errText))
	if err != nil {
		return 0, d.wrap(err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		// One row affected: inserted, the first attempt.
		return 1, err
	}
	n, err := res.LastInsertId()
	return int(n), err
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

// SaveFailed implements driver.Dialect. It needs the database/sql executor
// of a driver.SQLDriver, whose result carries the new row's id.
func (d *Dialect) SaveFailed(ctx context.Context, ex driver.Executor, m idem.FailedMessage) (int64, error) {
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
		n, err := ex.Exec(ctx, d.q.updateFailed, r.Error, entry, r.Attempts, r.HeldBy, m.ID, r.Consumer)
		if err != nil {
			return 0, d.wrap(err)
		}
		if n > 0 {
			return m.ID, nil
		}
	}
	res, err := se.Q.ExecContext(ctx, d.q.insertFailed,
		r.Consumer, r.Source, r.EventID, r.EventName, r.Key, r.Headers, r.Body, r.Error, entry, r.Attempts,
		r.AggregateType, r.AggregateID, r.HeldBy)
	if err != nil {
		return 0, d.wrap(err)
	}
	return res.LastInsertId()
}

// FindFailed implements driver.Dialect.
func (d *Dialect) FindFailed(ctx context.Context, ex driver.Executor, consumer string, id uuid.UUID, body []byte) (int64, error) {
	found, err := dialectkit.FindFailed(ctx, ex, d.q.findFailed, consumer, id, body)
	return found, d.wrap(err)
}

// ListFailed implements driver.Dialect.
func (d *Dialect) ListFailed(ctx context.Context, ex driver.Executor, f idem.FailedFilter) ([]idem.FailedMessage, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("idem: mysql: ListFailed: Limit %d: want a positive page size", f.Limit)
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
	var myErr *gomysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == errNoSuchTable
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

// sqltimeDest scans failure-store timestamps stored as UTC.
func sqltimeDest(t *time.Time) any { return sqltime.Scanner(t) }
