// Package sqlrelay implements driver.RelayDialect for the MySQL and SQLite
// dialects, which share their placeholders (?) and most of their SQL. Each
// dialect describes its differences in a Flavor.
//
// The claim follows the PostgreSQL dialect's semantics exactly: it only
// claims an aggregate's head (its unpublished row with the lowest seq) and
// the rows that follow it, never an aggregate with a row under an unexpired
// lease, and claims run one after the other (Flavor.ClaimLock), so each sees
// the leases of the previous ones.
package sqlrelay

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/sqltime"
)

// Flavor is what differs between the dialects.
type Flavor struct {
	// Outbox is the quoted, qualified outbox table.
	Outbox string
	// Now is the SQL expression of the current time, comparable with the
	// timestamp columns.
	Now string
	// NowPlus is the SQL expression of the current time plus the duration
	// bound to its one placeholder, as made by DurationArg.
	NowPlus string
	// DurationArg turns a duration into NowPlus's argument.
	DurationArg func(time.Duration) any
	// ClaimLock is run first in a claim's transaction and serialises claims
	// until the transaction ends.
	ClaimLock string
	// HeadsLock, when not empty ("FOR UPDATE SKIP LOCKED"), makes the claim
	// lock the heads it selected, by primary key, rechecking that they are
	// still unpublished and free, and keep those it could lock. The heads
	// are first selected with a plain read: a locking range scan of the
	// pending rows would also lock the gaps where producers insert, and
	// deadlock with them (InnoDB's next-key locks).
	HeadsLock string
	// DeletePublished deletes at most ? (second argument) rows published
	// before ? (first argument).
	DeletePublished string
	// Wrap translates errors (the missing-table hint).
	Wrap func(error) error
}

// Relay implements the methods of driver.RelayDialect for a Flavor.
type Relay struct {
	f Flavor

	claimHeads   string
	backlog      string
	replayCounts string
	replayRows   string
}

// relayColumns are the columns scanRecord reads.
const relayColumns = `id, aggregatetype, aggregateid, type, payload, occurred_at,
    aggregate_version, headers, seq, created_at, attempts`

// replayWhere selects published rows by period, event name and aggregate
// type; see replayArgs.
const replayWhere = `published_at IS NOT NULL
  AND (? IS NULL OR occurred_at >= ?)
  AND (? IS NULL OR occurred_at < ?)
  AND (? = '' OR type = ?)
  AND (? = '' OR aggregatetype = ?)`

// New returns the relay operations of f.
func New(f Flavor) *Relay {
	o := f.Outbox
	return &Relay{
		f: f,
		claimHeads: `SELECT o.id, o.aggregatetype, o.aggregateid, o.seq, o.lease_owner IS NOT NULL
FROM ` + o + ` o
WHERE o.published_at IS NULL
  AND (o.lease_until IS NULL OR o.lease_until <= ` + f.Now + `)
  AND NOT EXISTS (
    SELECT 1 FROM ` + o + ` p
    WHERE p.aggregatetype = o.aggregatetype AND p.aggregateid = o.aggregateid
      AND p.published_at IS NULL AND p.seq < o.seq)
  AND COALESCE((
    SELECT n.lease_until > ` + f.Now + ` FROM ` + o + ` n
    WHERE n.aggregatetype = o.aggregatetype AND n.aggregateid = o.aggregateid
      AND n.published_at IS NULL AND n.seq > o.seq
    ORDER BY n.seq
    LIMIT 1), 0) = 0
ORDER BY o.seq
LIMIT ?`,
		backlog: `SELECT COUNT(*),
    (SELECT created_at FROM ` + o + ` WHERE published_at IS NULL ORDER BY seq LIMIT 1)
FROM ` + o + ` WHERE published_at IS NULL`,
		replayCounts: `SELECT type, COUNT(*) FROM ` + o + `
WHERE ` + replayWhere + `
GROUP BY type
ORDER BY type`,
		replayRows: `SELECT ` + relayColumns + ` FROM ` + o + `
WHERE ` + replayWhere + `
  AND seq > ?
ORDER BY seq
LIMIT ?`,
	}
}

func placeholders(n int, group string) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(group)
	}
	return b.String()
}

// ClaimOutbox implements driver.RelayDialect.ClaimOutbox.
func (r *Relay) ClaimOutbox(ctx context.Context, ex driver.Executor, p driver.ClaimParams) ([]driver.ClaimedRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	if _, err := ex.Exec(ctx, r.f.ClaimLock); err != nil {
		return nil, r.f.Wrap(err)
	}
	type head struct {
		id                         string
		aggregateType, aggregateID string
		takenOver                  bool
	}
	var heads []head
	err := driver.QueryRows(ctx, ex, r.claimHeads, []any{p.HeadLimit()}, func(rows driver.Rows) error {
		var (
			h   head
			seq int64
		)
		if err := rows.Scan(&h.id, &h.aggregateType, &h.aggregateID, &seq, &h.takenOver); err != nil {
			return err
		}
		heads = append(heads, h)
		return nil
	})
	if err != nil {
		return nil, r.f.Wrap(err)
	}
	if len(heads) > 0 && r.f.HeadsLock != "" {
		args := make([]any, len(heads))
		for i, h := range heads {
			args[i] = h.id
		}
		locked := map[string]bool{}
		err := driver.QueryRows(ctx, ex, `SELECT id FROM `+r.f.Outbox+`
WHERE id IN (`+placeholders(len(heads), "?")+`)
  AND published_at IS NULL AND (lease_until IS NULL OR lease_until <= `+r.f.Now+`)
`+r.f.HeadsLock, args, func(rows driver.Rows) error {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			locked[id] = true
			return nil
		})
		if err != nil {
			return nil, r.f.Wrap(err)
		}
		kept := heads[:0]
		for _, h := range heads {
			if locked[h.id] {
				kept = append(kept, h)
			}
		}
		heads = kept
	}
	if len(heads) == 0 {
		return nil, nil
	}
	ids := make([]any, 0, p.Limit)
	takenOver := make(map[string]bool)
	for _, h := range heads {
		ids = append(ids, h.id)
		if h.takenOver {
			takenOver[h.id] = true
		}
	}

	// Fill the rest of the batch with the rows that follow the heads. Nobody
	// else can claim them: they are not heads, and their heads are ours.
	room := p.Limit - len(heads)
	perAggregate := min(p.MaxPerAggregate-1, room/len(heads))
	if perAggregate > 0 {
		var match strings.Builder
		args := make([]any, 0, 2*len(heads)+1)
		for i, h := range heads {
			if i > 0 {
				match.WriteString(" OR ")
			}
			match.WriteString("(o.aggregatetype = ? AND o.aggregateid = ?)")
			args = append(args, h.aggregateType, h.aggregateID)
		}
		args = append(args, perAggregate+1)
		query := `SELECT f.aggregatetype, f.aggregateid, f.id, f.lease_owner IS NOT NULL, COALESCE(f.lease_until > ` + r.f.Now + `, 0)
FROM (
    SELECT o.id, o.aggregatetype, o.aggregateid, o.seq, o.lease_owner, o.lease_until,
        ROW_NUMBER() OVER (PARTITION BY o.aggregatetype, o.aggregateid ORDER BY o.seq) AS rn
    FROM ` + r.f.Outbox + ` o
    WHERE o.published_at IS NULL AND (` + match.String() + `)) f
WHERE f.rn BETWEEN 2 AND ?
ORDER BY f.aggregatetype, f.aggregateid, f.seq`
		type aggregate struct{ typ, id string }
		stopped := map[aggregate]bool{}
		err := driver.QueryRows(ctx, ex, query, args, func(rows driver.Rows) error {
			var (
				agg         aggregate
				id          string
				taken, busy bool
			)
			if err := rows.Scan(&agg.typ, &agg.id, &id, &taken, &busy); err != nil {
				return err
			}
			// A row still waiting for a retry delay ends the run of rows
			// taken from its aggregate.
			if busy || stopped[agg] {
				stopped[agg] = true
				return nil
			}
			ids = append(ids, id)
			if taken {
				takenOver[id] = true
			}
			return nil
		})
		if err != nil {
			return nil, r.f.Wrap(err)
		}
	}

	in := placeholders(len(ids), "?")
	args := append([]any{p.Owner.String(), r.f.DurationArg(p.Lease)}, ids...)
	if _, err := ex.Exec(ctx, `UPDATE `+r.f.Outbox+` SET lease_owner = ?, lease_until = `+r.f.NowPlus+` WHERE id IN (`+in+`)`, args...); err != nil {
		return nil, r.f.Wrap(err)
	}
	out := make([]driver.ClaimedRow, 0, len(ids))
	err = driver.QueryRows(ctx, ex, `SELECT `+relayColumns+` FROM `+r.f.Outbox+` WHERE id IN (`+in+`) ORDER BY seq`, ids, func(rows driver.Rows) error {
		var c driver.ClaimedRow
		if err := scanRecord(rows, &c.OutboxRecord); err != nil {
			return err
		}
		c.TakenOver = takenOver[c.ID.String()]
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, r.f.Wrap(err)
	}
	return out, nil
}

// scanRecord scans the columns of relayColumns.
func scanRecord(rows driver.Rows, r *driver.OutboxRecord) error {
	return driver.ScanOutboxRecord(rows, r, func(t *time.Time) any { return sqltime.Scanner(t) })
}

func idArgs(ids []uuid.UUID) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// MarkPublished implements driver.RelayDialect.MarkPublished.
func (r *Relay) MarkPublished(ctx context.Context, ex driver.Executor, owner uuid.UUID, ids []uuid.UUID) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	n, err := ex.Exec(ctx, `UPDATE `+r.f.Outbox+`
SET published_at = `+r.f.Now+`, lease_owner = NULL, lease_until = NULL
WHERE lease_owner = ? AND id IN (`+placeholders(len(ids), "?")+`)`,
		append([]any{owner.String()}, idArgs(ids)...)...)
	return n, r.f.Wrap(err)
}

// ReleaseOutbox implements driver.RelayDialect.ReleaseOutbox. Rows not
// attempted are released in one statement, failed ones one by one (each has
// its own error and delay).
func (r *Relay) ReleaseOutbox(ctx context.Context, ex driver.Executor, owner uuid.UUID, rows []driver.ReleaseRow) (int64, error) {
	var (
		untried []uuid.UUID
		total   int64
	)
	for _, row := range rows {
		if row.Error == "" {
			untried = append(untried, row.ID)
			continue
		}
		n, err := ex.Exec(ctx, `UPDATE `+r.f.Outbox+`
SET lease_owner = NULL, lease_until = `+r.f.NowPlus+`, attempts = attempts + 1, last_error = ?
WHERE id = ? AND lease_owner = ?`,
			r.f.DurationArg(row.Delay), row.Error, row.ID.String(), owner.String())
		if err != nil {
			return total, r.f.Wrap(err)
		}
		total += n
	}
	if len(untried) > 0 {
		n, err := ex.Exec(ctx, `UPDATE `+r.f.Outbox+`
SET lease_owner = NULL, lease_until = NULL
WHERE lease_owner = ? AND id IN (`+placeholders(len(untried), "?")+`)`,
			append([]any{owner.String()}, idArgs(untried)...)...)
		if err != nil {
			return total, r.f.Wrap(err)
		}
		total += n
	}
	return total, nil
}

// DeletePublished implements driver.RelayDialect.DeletePublished.
func (r *Relay) DeletePublished(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, r.f.DeletePublished, sqltime.Format(before), limit)
	return n, r.f.Wrap(err)
}

// OutboxBacklog implements driver.RelayDialect.OutboxBacklog.
func (r *Relay) OutboxBacklog(ctx context.Context, ex driver.Executor) (driver.Backlog, error) {
	var b driver.Backlog
	err := driver.QueryRow(ctx, ex, r.backlog, nil, &b.Rows, sqltime.Scanner(&b.Oldest))
	return b, r.f.Wrap(err)
}

func replayArgs(f driver.ReplayFilter) []any {
	since, until := sqltime.Arg(f.Since), sqltime.Arg(f.Until)
	return []any{since, since, until, until, f.EventName, f.EventName, f.AggregateType, f.AggregateType}
}

// ReplayCounts implements driver.RelayDialect.ReplayCounts.
func (r *Relay) ReplayCounts(ctx context.Context, ex driver.Executor, f driver.ReplayFilter) (map[string]int64, error) {
	out := map[string]int64{}
	err := driver.QueryRows(ctx, ex, r.replayCounts, replayArgs(f), func(rows driver.Rows) error {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return err
		}
		out[name] = n
		return nil
	})
	if err != nil {
		return nil, r.f.Wrap(err)
	}
	return out, nil
}

// ReplayRows implements driver.RelayDialect.ReplayRows.
func (r *Relay) ReplayRows(ctx context.Context, ex driver.Executor, f driver.ReplayFilter, afterSeq int64, limit int) ([]driver.OutboxRecord, error) {
	var out []driver.OutboxRecord
	err := driver.QueryRows(ctx, ex, r.replayRows, append(replayArgs(f), afterSeq, limit), func(rows driver.Rows) error {
		var rec driver.OutboxRecord
		if err := scanRecord(rows, &rec); err != nil {
			return err
		}
		out = append(out, rec)
		return nil
	})
	if err != nil {
		return nil, r.f.Wrap(err)
	}
	return out, nil
}
