// Package sqlbase is what the MySQL and SQLite dialects share: statements
// with ? placeholders, times as sqltime text, run over database/sql. A
// dialect describes its SQL where it differs in a Flavor and embeds the
// Dialect that New returns, which implements every method of driver.Dialect
// but the three whose Go code differs between them: MarkProcessed,
// RecordAttempt and SaveFailed.
package sqlbase

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/failrow"
	"github.com/idem-go/idem/driver/internal/sqltime"
	"github.com/idem-go/idem/driver/internal/versioned"
)

// Flavor is what differs between the dialects: their SQL where it is not
// the same, and their error classification.
type Flavor struct {
	// Spec is what dialectkit.Base needs. The dialect sets its Name,
	// Tables, Names, Quote, Migrations, IsMissingTable and IsTransient, its
	// MigrationSupport but for the statements on versions, the Outbox and
	// Names statements of Status, and the Heartbeat and Acquire upserts of
	// Groups; New sets the rest, which the dialects share.
	dialectkit.Spec

	// Now is the SQL expression of the current time, comparable with the
	// timestamp columns.
	Now string
	// NowPlus is Now plus the duration bound to its one placeholder, as
	// DurationArg makes it.
	NowPlus string
	// DurationArg turns a duration into NowPlus's argument.
	DurationArg func(time.Duration) any
	// DeleteOldest returns a statement deleting at most ? (its last
	// argument) rows of table that match where, in the order of order;
	// key is the table's primary key.
	DeleteOldest func(table, key, where, order string) string
	// RowValues comes before a list of row values after IN: "" or
	// "VALUES ".
	RowValues string
	// IsKeyConflict, when set, recognises the duplicate-key error on the
	// primary key of table: InsertIdempotencyKey then inserts with a plain
	// INSERT and takes that error as "the key exists" (MySQL, whose INSERT
	// IGNORE would hide every other error). When nil, it inserts with ON
	// CONFLICT DO NOTHING.
	IsKeyConflict func(err error, table string) bool

	// ClaimLock is run first in a claim's transaction and serialises claims
	// until the transaction ends.
	ClaimLock string
	// BySeq, when not empty, is the table reference of the relay's
	// statements that look rows up by seq (MySQL: the outbox with FORCE
	// INDEX on its seq index). Without it, MySQL may read "seq IN (...) AND
	// published_at IS NULL" through pending_idx, a locking range scan that
	// also locks the gaps where producers insert. Empty means the outbox.
	BySeq string
	// PendingHint and AggregateHint, when not empty, are the index hints
	// that follow the outbox's alias in the claim's reads: its scan of the
	// unpublished rows in seq order (MySQL: FORCE INDEX on pending_idx;
	// left to itself, MySQL may read them through the seq index, every
	// published row the table keeps included, for the ORDER BY), and its
	// reads of one aggregate's unpublished rows in seq order (MySQL: FORCE
	// INDEX on aggregate_pending_idx).
	PendingHint, AggregateHint string
	// UnionTerm returns a SELECT with its own ORDER BY and LIMIT as a term
	// of a UNION ALL: in parentheses (MySQL), or as a subquery (SQLite,
	// which takes neither).
	UnionTerm func(sel string) string
	// HeadsLock, when not empty ("FOR UPDATE SKIP LOCKED"), makes the claim
	// lock the heads it selected, by primary key, rechecking that they are
	// still unpublished and free, and keep those it could lock. The heads
	// are first selected with a plain read: a locking range scan of the
	// pending rows would also lock the gaps where producers insert, and
	// deadlock with them (InnoDB's next-key locks).
	HeadsLock string

	// GroupInList is the condition that partition_no is in the
	// comma-separated list of numbers bound to its one placeholder.
	GroupInList string

	// PauseUpsert is what follows the VALUES list of the insert of a
	// pause, to replace the row of the same kind and name: an ON CONFLICT
	// or ON DUPLICATE KEY clause.
	PauseUpsert string

	// Versioned is how UpsertVersioned reads and writes.
	Versioned versioned.Flavor

	// MarkProcessedOne, MarkProcessedMany (of n markers), RecordAttempt,
	// InsertFailed and UpdateFailed are the statements of the methods the
	// dialect adds, which read them through Dialect.Flavor.
	MarkProcessedOne, RecordAttempt, InsertFailed, UpdateFailed string
	MarkProcessedMany                                           func(n int) string
	// ChangeFailed is the statement of ChangeFailed. Its arguments: the
	// edit flag three times, the edited body, the edit flag, the edited
	// headers (JSON text), the archive flag, the action (a JSON array of
	// one object) and the entry's id. It keeps the original body and
	// headers before it replaces them (MySQL assigns left to right), and
	// changes the row whenever the entry exists (the audit trail grows), so
	// that the count of affected rows says whether it does.
	ChangeFailed string
}

// Dialect implements driver.Dialect for a Flavor, but for MarkProcessed,
// RecordAttempt and SaveFailed, which the dialect adds.
type Dialect struct {
	*dialectkit.Base
	*relay
	f Flavor
	q queries
}

// New renders every statement of f and returns its Dialect.
func New(f Flavor) (*Dialect, error) {
	n := f.Names
	ms := &f.MigrationSupport
	ms.SelectVersions = "SELECT version FROM " + n.Migrations + " ORDER BY version"
	ms.InsertVersion = "INSERT INTO " + n.Migrations + " (version, name) VALUES (?, ?)"
	ms.DeleteVersion = "DELETE FROM " + n.Migrations + " WHERE version = ?"
	st := &f.Status
	st.Now = "SELECT " + f.Now
	st.Consumer, st.ConsumerArgs = statusConsumer(n)
	st.Time = TimeDest
	f.ConsumerCounts = `SELECT
    (SELECT count(*) FROM ` + n.FailedMessage + ` WHERE consumer_name = ? AND archived_at IS NULL),
    (SELECT count(*) FROM ` + n.DeliveryAttempt + ` a WHERE a.consumer_name = ?
        AND NOT EXISTS (SELECT 1 FROM ` + n.ProcessedEvent + ` p
                        WHERE p.consumer_name = a.consumer_name AND p.event_id = a.event_id))`
	f.Groups = groupSQL(&f)
	f.Pauses = dialectkit.PauseSQL{
		Upsert: `INSERT INTO ` + n.ConsumerPause + ` (kind, name, starts_at, ends_at, reason, paused_by, paused_at)
VALUES (?, ?, ?, ?, ?, ?, COALESCE(?, ` + f.Now + `))
` + f.PauseUpsert,
		Delete: `DELETE FROM ` + n.ConsumerPause + ` WHERE kind = ? AND name = ?`,
		List: `SELECT kind, name, starts_at, ends_at, reason, paused_by, paused_at FROM ` + n.ConsumerPause + `
WHERE (? = '' OR kind = ?) AND (? = '' OR name = ?)
ORDER BY kind, name`,
		TimeArg:  sqltime.Arg,
		TimeDest: TimeDest,
	}
	q := newQueries(&f)
	f.Failed = dialectkit.FailedSQL{
		Find: `SELECT id FROM ` + n.FailedMessage + `
WHERE consumer_name = ? AND event_id = ? AND (body = ? OR original_body = ?)
ORDER BY id
LIMIT 1`,
		Get:    `SELECT ` + q.failedColumns + ` FROM ` + n.FailedMessage + ` WHERE id = ?`,
		Delete: `DELETE FROM ` + n.FailedMessage + ` WHERE id = ?`,
		HasParked: `SELECT EXISTS (
    SELECT 1 FROM ` + n.FailedMessage + `
    WHERE consumer_name = ? AND held_by IS NULL AND aggregate_id <> '' AND archived_at IS NULL)`,
		Time: TimeDest,
	}
	base, err := dialectkit.NewBase(f.Spec)
	if err != nil {
		return nil, err
	}
	d := &Dialect{Base: base, f: f, q: q}
	d.relay = newRelay(&d.f, n.Outbox, base.Wrap)
	return d, nil
}

// Flavor returns the dialect's flavor.
func (d *Dialect) Flavor() *Flavor { return &d.f }

// statusConsumer returns the per-consumer statement of ReadStatus and the
// function giving its arguments: the latest marker and the markers since a
// time, read through processed_event's (consumer_name, processed_at) index,
// and the consumer's parked messages, oldest failure and attempt rows, read
// through keys that start with consumer_name.
func statusConsumer(n dialectkit.Names) (string, func(name, encoded string, since time.Time) []any) {
	return `SELECT
    (SELECT MAX(processed_at) FROM ` + n.ProcessedEvent + ` WHERE consumer_name = ?),
    (SELECT COUNT(*) FROM ` + n.ProcessedEvent + ` WHERE consumer_name = ? AND processed_at > ?),
    (SELECT COUNT(*) FROM ` + n.FailedMessage + ` WHERE consumer_name = ? AND archived_at IS NULL),
    (SELECT MIN(first_failed_at) FROM ` + n.FailedMessage + ` WHERE consumer_name = ? AND archived_at IS NULL),
    (SELECT COUNT(*) FROM ` + n.DeliveryAttempt + ` WHERE consumer_name = ?)`,
		func(name, encoded string, since time.Time) []any {
			return []any{name, name, sqltime.Format(since), encoded, encoded, name}
		}
}

// groupSQL returns the statements of the ownership groups: those the
// dialects share, with the upserts of f.Groups.
func groupSQL(f *Flavor) dialectkit.GroupSQL {
	m, p := f.Names.ConsumerMember, f.Names.ConsumerPartition
	return dialectkit.GroupSQL{
		Heartbeat:            f.Groups.Heartbeat,
		DeleteExpiredMembers: `DELETE FROM ` + m + ` WHERE consumer_name = ? AND lease_until <= ` + f.Now,
		SelectLiveMembers:    `SELECT member_id FROM ` + m + ` WHERE consumer_name = ? AND lease_until > ` + f.Now,
		DeleteMember:         `DELETE FROM ` + m + ` WHERE consumer_name = ? AND member_id = ?`,
		Acquire:              f.Groups.Acquire,
		SelectPartition: `SELECT owner, epoch, lease_until, COALESCE(lease_until > ` + f.Now + `, 0)
FROM ` + p + ` WHERE consumer_name = ? AND partition_no = ?`,
		Renew: `UPDATE ` + p + ` SET lease_until = ` + f.NowPlus + `
WHERE consumer_name = ? AND owner = ? AND ` + f.GroupInList + ` AND lease_until > ` + f.Now,
		SelectOwned: `SELECT partition_no FROM ` + p + ` WHERE consumer_name = ? AND owner = ? AND lease_until > ` + f.Now,
		Release: `UPDATE ` + p + ` SET owner = NULL, lease_until = NULL
WHERE consumer_name = ? AND partition_no = ? AND owner = ?`,
		Now: `SELECT ` + f.Now,
		ListMembers: `SELECT consumer_name, member_id, lease_until FROM ` + m + `
WHERE ? = '' OR consumer_name = ?
ORDER BY consumer_name, member_id`,
		ListPartitions: `SELECT consumer_name, partition_no, owner, epoch, lease_until FROM ` + p + `
WHERE ? = '' OR consumer_name = ?
ORDER BY consumer_name, partition_no`,
		DurationArg: f.DurationArg,
		TimeDest:    TimeDest,
	}
}

// queries are the statements of the Dialect's own methods.
type queries struct {
	failedColumns                      string
	purgeProcessed, purgeAttempts      string
	listFailedNewest, listFailedOldest string
	countFailed                        string
	purgeFailed                        string

	keyInsert, keyGet, keyReclaim, keyComplete, keyRelease, keyPurge string
}

func newQueries(f *Flavor) queries {
	n := f.Names
	failedColumns := `id, consumer_name, source, event_id, event_name, message_key, headers, body, ` +
		f.Quote("error") + `, ` + f.Quote("errors") + `, attempts, first_failed_at, failed_at, aggregate_type, aggregate_id, held_by,
       original_body, original_headers, archived_at, actions`
	const failedWhere = `WHERE (? = '' OR consumer_name = ?) AND (? = '' OR event_name = ?)
  AND (? = '' OR aggregate_type = ?) AND (? = '' OR aggregate_id = ?)
  AND (? = 0 OR held_by = ?) AND (? IS NULL OR failed_at >= ?)
  AND (? = 0 OR id < ?) AND (? = 0 OR id > ?)
  AND (archived_at IS NOT NULL) = ?`
	keys := n.IdempotentRequest
	keyInsert := `INSERT INTO ` + keys + ` (scope, idem_key, fingerprint, state, owner, locked_until, expires_at, created_at)
VALUES (?, ?, ?, 'processing', ?, ?, ?, ?)`
	if f.IsKeyConflict == nil {
		keyInsert += `
ON CONFLICT (scope, idem_key) DO NOTHING`
	}
	return queries{
		failedColumns: failedColumns,
		purgeProcessed: f.DeleteOldest(n.ProcessedEvent, "consumer_name, event_id",
			"processed_at < ? AND (? = '' OR consumer_name = ?)", "processed_at"),
		purgeAttempts: f.DeleteOldest(n.DeliveryAttempt, "consumer_name, event_id",
			"last_failed_at < ? AND (? = '' OR consumer_name = ?)", "last_failed_at"),
		listFailedNewest: `SELECT ` + failedColumns + ` FROM ` + n.FailedMessage + `
` + failedWhere + `
ORDER BY id DESC
LIMIT ?`,
		listFailedOldest: `SELECT ` + failedColumns + ` FROM ` + n.FailedMessage + `
` + failedWhere + `
ORDER BY id
LIMIT ?`,
		countFailed: `SELECT count(*) FROM ` + n.FailedMessage + `
` + failedWhere,
		purgeFailed: f.DeleteOldest(n.FailedMessage, "id", "failed_at < ? AND (? = '' OR consumer_name = ?)", "failed_at"),

		// The idempotency key table (migration 0004).
		keyInsert: keyInsert,
		keyGet: `SELECT fingerprint, state = 'done', owner, COALESCE(response_status, 0), COALESCE(response_headers, ''),
       response_body, locked_until, expires_at, created_at, completed_at
FROM ` + keys + ` WHERE scope = ? AND idem_key = ?`,
		keyReclaim: `UPDATE ` + keys + ` SET fingerprint = ?, state = 'processing', owner = ?, response_status = NULL,
    response_headers = NULL, response_body = NULL, locked_until = ?, expires_at = ?, created_at = ?, completed_at = NULL
WHERE scope = ? AND idem_key = ? AND owner = ?
  AND (expires_at <= ? OR (state = 'processing' AND locked_until <= ?))`,
		keyComplete: `UPDATE ` + keys + ` SET state = 'done', response_status = ?, response_headers = ?, response_body = ?, completed_at = ?
WHERE scope = ? AND idem_key = ? AND owner = ? AND state = 'processing'`,
		keyRelease: `DELETE FROM ` + keys + ` WHERE scope = ? AND idem_key = ? AND owner = ? AND state = 'processing'`,
		keyPurge:   f.DeleteOldest(keys, "scope, idem_key", "expires_at <= ?", "expires_at"),
	}
}

// Chunk is the most ids or aggregates one statement carries (3 parameters
// each stays below SQLite's limit of 32766).
const Chunk = 1000

// Tuples returns n copies of tuple separated by commas.
func Tuples(n int, tuple string) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(tuple)
	}
	return b.String()
}

// HashArg is a payload hash as stored: NULL for 0 (unknown).
func HashArg(h int64) any {
	if h == 0 {
		return nil
	}
	return h
}

// IDArgs returns ids as the statements' arguments (text).
func IDArgs(ids []uuid.UUID) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// TimeDest scans a timestamp column as sqltime stores it.
func TimeDest(t *time.Time) any { return sqltime.Scanner(t) }

// InsertOutbox implements driver.Dialect.
func (d *Dialect) InsertOutbox(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow) error {
	query := func(n int, delayed, typed bool) string {
		cols, tuple := "id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers", "?, ?, ?, ?, ?, ?, ?, ?"
		if delayed {
			cols, tuple = cols+", not_before", tuple+", ?"
		}
		if typed {
			cols, tuple = cols+", content_type, payload_binary", tuple+", ?, ?"
		}
		return `INSERT INTO ` + d.f.Names.Outbox + ` (` + cols + `) VALUES ` + Tuples(n, "("+tuple+")")
	}
	return d.Wrap(dialectkit.InsertOutboxRows(ctx, ex, rows, query, func(r driver.OutboxRow, payload any, headers string) []any {
		return []any{r.ID.String(), r.AggregateType, r.AggregateID, r.Type, payload, sqltime.Format(r.OccurredAt), r.AggregateVersion, headers}
	}, func(t time.Time) any { return sqltime.Format(t) }))
}

// ProcessedHashes implements driver.Dialect.
func (d *Dialect) ProcessedHashes(ctx context.Context, ex driver.Executor, consumer string, ids []uuid.UUID) (map[uuid.UUID]int64, error) {
	out := map[uuid.UUID]int64{}
	for start := 0; start < len(ids); start += Chunk {
		part := ids[start:min(len(ids), start+Chunk)]
		query := `SELECT event_id, payload_hash FROM ` + d.f.Names.ProcessedEvent + `
WHERE consumer_name = ? AND payload_hash IS NOT NULL AND event_id IN (` + Tuples(len(part), "?") + `)`
		err := driver.QueryRows(ctx, ex, query, append([]any{consumer}, IDArgs(part)...), func(rows driver.Rows) error {
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
			return nil, d.Wrap(err)
		}
	}
	return out, nil
}

// PurgeProcessed implements driver.Dialect.
func (d *Dialect) PurgeProcessed(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeProcessed, sqltime.Format(before), consumer, consumer, limit)
	return n, d.Wrap(err)
}

// ClearAttempts implements driver.Dialect.
func (d *Dialect) ClearAttempts(ctx context.Context, ex driver.Executor, consumer string, ids []uuid.UUID) error {
	for start := 0; start < len(ids); start += Chunk {
		part := ids[start:min(len(ids), start+Chunk)]
		query := `DELETE FROM ` + d.f.Names.DeliveryAttempt + ` WHERE consumer_name = ? AND event_id IN (` + Tuples(len(part), "?") + `)`
		if _, err := ex.Exec(ctx, query, append([]any{consumer}, IDArgs(part)...)...); err != nil {
			return d.Wrap(err)
		}
	}
	return nil
}

// PurgeAttempts implements driver.Dialect.
func (d *Dialect) PurgeAttempts(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.q.purgeAttempts, sqltime.Format(before), consumer, consumer, limit)
	return n, d.Wrap(err)
}

// ListFailed implements driver.Dialect.
func (d *Dialect) ListFailed(ctx context.Context, ex driver.Executor, f idem.FailedFilter) ([]idem.FailedMessage, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("idem: %s: ListFailed: Limit %d: want a positive page size", d.Name(), f.Limit)
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
		before, before, after, after, f.Archived, f.Limit}, TimeDest)
	return list, d.Wrap(err)
}

// CountFailed implements driver.Dialect.
func (d *Dialect) CountFailed(ctx context.Context, ex driver.Executor, f idem.FailedFilter) (int64, error) {
	f = failrow.Filter(f)
	since := sqltime.Arg(f.Since)
	heldBy, before, after := max(f.HeldBy, 0), max(f.BeforeID, 0), max(f.AfterID, 0)
	var n int64
	err := driver.QueryRow(ctx, ex, d.q.countFailed, []any{f.Consumer, f.Consumer, f.EventName, f.EventName,
		f.AggregateType, f.AggregateType, f.AggregateID, f.AggregateID, heldBy, heldBy, since, since,
		before, before, after, after, f.Archived}, &n)
	return n, d.Wrap(err)
}

// ChangeFailed implements driver.Dialect.
func (d *Dialect) ChangeFailed(ctx context.Context, ex driver.Executor, id int64, c driver.FailedChange) (bool, error) {
	body, headers, action, err := failrow.Change(c, time.Now())
	if err != nil {
		return false, err
	}
	n, err := ex.Exec(ctx, d.f.ChangeFailed, c.Edit, c.Edit, c.Edit, body, c.Edit, headers, c.Archive, action, id)
	return n == 1, d.Wrap(err)
}

// PurgeFailed implements driver.Dialect.
func (d *Dialect) PurgeFailed(ctx context.Context, ex driver.Executor, consumer string, before time.Time, limit int) (int64, error) {
	consumer = failrow.Text(consumer)
	n, err := ex.Exec(ctx, d.q.purgeFailed, sqltime.Format(before), consumer, consumer, limit)
	return n, d.Wrap(err)
}

// ParkedAggregates implements driver.Dialect, in one statement per Chunk
// aggregates.
func (d *Dialect) ParkedAggregates(ctx context.Context, ex driver.Executor, consumer string, aggs []idem.AggregateRef) (map[idem.AggregateRef]int64, error) {
	query := func(n int) string {
		return `SELECT aggregate_type, aggregate_id, MIN(id) FROM ` + d.f.Names.FailedMessage + `
WHERE consumer_name = ? AND held_by IS NULL AND aggregate_id <> '' AND archived_at IS NULL
  AND (aggregate_type, aggregate_id) IN (` + d.f.RowValues + Tuples(n, "(?, ?)") + `)
GROUP BY aggregate_type, aggregate_id`
	}
	out, err := failrow.ParkedAggregates(ctx, ex, consumer, aggs, Chunk, query)
	return out, d.Wrap(err)
}

// UpsertVersioned implements driver.Dialect.
func (d *Dialect) UpsertVersioned(ctx context.Context, ex driver.Executor, p driver.UpsertVersionedParams) (driver.UpsertVersionedResult, error) {
	res, err := d.f.Versioned.Upsert(ctx, ex, p)
	return res, d.Wrap(err)
}
