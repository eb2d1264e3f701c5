// Package postgres is idem's PostgreSQL dialect, with drivers for pgx v5
// (NewPgx, transactions of type pgx.Tx) and database/sql (NewSQL, *sql.Tx with
// the pgx stdlib driver). All of its SQL is in this package: migrations in
// migrations/*.sql, queries in queries.go.
package postgres

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"
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

// dialect is the PostgreSQL dialect bound to a set of table names.
type dialect struct {
	*dialectkit.Base
	q    queries
	rq   relayQueries
	aq   archiveQueries
	keys idempotencyQueries
}

// NewDialect returns the PostgreSQL dialect for tables (zero value: defaults).
func NewDialect(tables idem.Tables) (driver.Dialect, error) { return newDialect(tables) }

func newDialect(tables idem.Tables) (*dialect, error) {
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	t := tables.WithDefaults()
	n := dialectkit.TableNames(t, QuoteIdent)
	mt := n.Migrations
	q := newQueries(n.Outbox, n.ProcessedEvent, n.FailedMessage, n.DeliveryAttempt)
	base, err := dialectkit.NewBase(dialectkit.Spec{
		Name:       "postgres",
		Tables:     t,
		Names:      n,
		Quote:      QuoteIdent,
		Migrations: migrationFiles,
		MigrationSupport: driver.MigrationSupport{
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
		},
		IsMissingTable: isMissingTable,
		IsTransient:    IsTransient,
		Status:         newStatusSQL(n.Outbox, n.ProcessedEvent, n.FailedMessage, n.DeliveryAttempt),
		ConsumerCounts: consumerCountsQuery(n.FailedMessage, n.DeliveryAttempt, n.ProcessedEvent),
		Groups:         newGroupSQL(n.ConsumerMember, n.ConsumerPartition),
		Failed:         q.failed,
		Pauses:         newPauseSQL(n.ConsumerPause),
	})
	if err != nil {
		return nil, err
	}
	return &dialect{Base: base, q: q, rq: newRelayQueries(n.Outbox), aq: newArchiveQueries(n.Outbox, n.OutboxName, n.OutboxArchive), keys: newIdempotencyQueries(n.IdempotentRequest)}, nil
}

// MustDialect is NewDialect for table names known to be valid.
func MustDialect(tables idem.Tables) driver.Dialect { return mustDialect(tables) }

func mustDialect(tables idem.Tables) *dialect { return dialectkit.Must(newDialect(tables)) }

// QuoteIdent quotes an SQL identifier for PostgreSQL.
func QuoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// OutboxChannel returns the LISTEN channel the outbox trigger notifies:
// "<schema>.<table>", where schema is the configured one or, when empty,
// currentSchema (the connection's current_schema()).
func (d *dialect) OutboxChannel(currentSchema string) string {
	t := d.Tables()
	return cmp.Or(t.Schema, currentSchema) + "." + t.Outbox
}

// InsertOutbox implements driver.Dialect.
func (d *dialect) InsertOutbox(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow) error {
	return d.Wrap(dialectkit.InsertOutboxRows(ctx, ex, rows, d.q.insertOutbox, func(r driver.OutboxRow, payload any, headers string) []any {
		return []any{r.ID, r.AggregateType, r.AggregateID, r.Type, payload, r.OccurredAt, r.AggregateVersion, headers}
	}, func(t time.Time) any { return t }))
}

// MarkProcessed implements driver.Dialect.
func (d *dialect) MarkProcessed(ctx context.Context, ex driver.Executor, consumer string, marks []driver.Mark) ([]bool, error) {
	inserted := make([]bool, len(marks))
	if len(marks) == 0 {
		return inserted, nil
	}
	if len(marks) == 1 {
		n, err := ex.Exec(ctx, d.q.markProcessedOne, consumer, marks[0].ID, marks[0].Hash)
		if err != nil {
			return nil, d.Wrap(err)
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
		return nil, d.Wrap(err)
	}
	return inserted, nil
}

// ProcessedHashes implements driver.Dialect.
func (d *dialect) ProcessedHashes(ctx context.Context, ex driver.Executor, consumer string, ids []uuid.UUID) (map[uuid.UUID]int64, error) {
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
		return nil, d.Wrap(err)
	}
	return out, nil
}

// PurgeProcessed implements driver.Dialect.
func (d *dialect) PurgeProcessed(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeProcessed, before, consumer, limit)
	return n, d.Wrap(err)
}

// RecordAttempt implements driver.Dialect with INSERT ... ON CONFLICT DO
// UPDATE, which counts concurrent calls one after the other.
func (d *dialect) RecordAttempt(ctx context.Context, ex driver.Executor, consumer string, id uuid.UUID, errText string) (int, error) {
	var n int
	err := driver.QueryRow(ctx, ex, d.q.recordAttempt, []any{consumer, id, failrow.Text(errText)}, &n)
	return n, d.Wrap(err)
}

// ClearAttempts implements driver.Dialect.
func (d *dialect) ClearAttempts(ctx context.Context, ex driver.Executor, consumer string, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := ex.Exec(ctx, d.q.clearAttempts, consumer, uuidStrings(ids))
	return d.Wrap(err)
}

// PurgeAttempts implements driver.Dialect.
func (d *dialect) PurgeAttempts(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeAttempts, before, consumer, limit)
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
		err = driver.QueryRow(ctx, ex, d.q.updateFailed, []any{m.ID, r.Consumer, r.Error, r.Attempts, r.HeldBy}, &id)
		if !errors.Is(err, idem.ErrNotFound) {
			return id, d.Wrap(err)
		}
	}
	err = driver.QueryRow(ctx, ex, d.q.insertFailed,
		[]any{r.Consumer, r.Source, r.EventID, r.EventName, r.Key, r.Headers, r.Body, r.Error, r.Attempts,
			r.AggregateType, r.AggregateID, r.HeldBy},
		&id)
	return id, d.Wrap(err)
}

// ListFailed implements driver.Dialect.
func (d *dialect) ListFailed(ctx context.Context, ex driver.Executor, f idem.FailedFilter) ([]idem.FailedMessage, error) {
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
		max(f.HeldBy, 0), since, max(f.BeforeID, 0), max(f.AfterID, 0), f.Archived, f.Limit}, nil)
	return list, d.Wrap(err)
}

// CountFailed implements driver.Dialect.
func (d *dialect) CountFailed(ctx context.Context, ex driver.Executor, f idem.FailedFilter) (int64, error) {
	f = failrow.Filter(f)
	var since any
	if !f.Since.IsZero() {
		since = f.Since
	}
	var n int64
	err := driver.QueryRow(ctx, ex, d.q.countFailed, []any{f.Consumer, f.EventName, f.AggregateType, f.AggregateID,
		max(f.HeldBy, 0), since, max(f.BeforeID, 0), max(f.AfterID, 0), f.Archived}, &n)
	return n, d.Wrap(err)
}

// ChangeFailed implements driver.Dialect.
func (d *dialect) ChangeFailed(ctx context.Context, ex driver.Executor, id int64, c driver.FailedChange) (bool, error) {
	body, headers, action, err := failrow.Change(c, time.Now())
	if err != nil {
		return false, err
	}
	n, err := ex.Exec(ctx, d.q.changeFailed, id, c.Edit, body, headers, c.Archive, action)
	return n == 1, d.Wrap(err)
}

// PurgeFailed implements driver.Dialect.
func (d *dialect) PurgeFailed(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeFailed, before, failrow.Text(consumer), limit)
	return n, d.Wrap(err)
}

// ParkedAggregates implements driver.Dialect in one statement.
func (d *dialect) ParkedAggregates(ctx context.Context, ex driver.Executor, consumer string, aggs []idem.AggregateRef) (map[idem.AggregateRef]int64, error) {
	out := map[idem.AggregateRef]int64{}
	types, ids, back := failrow.Aggregates(aggs)
	if len(types) == 0 {
		return out, nil
	}
	err := driver.QueryRows(ctx, ex, d.q.parkedAggregates, []any{failrow.Text(consumer), types, ids}, failrow.ScanParked(out, back))
	if err != nil {
		return nil, d.Wrap(err)
	}
	return out, nil
}

// isMissingTable reports whether err is undefined_table (42P01).
func isMissingTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// IsUniqueViolation reports whether err is a unique violation, on constraint
// when it is not empty.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && (constraint == "" || pgErr.ConstraintName == constraint)
}

func uuidStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}
