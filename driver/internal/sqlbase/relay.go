package sqlbase

// The relay's statements. The claim follows the PostgreSQL dialect's
// semantics exactly: it only claims an aggregate's head (its unpublished
// row with the lowest seq) and the rows that follow it, never an aggregate
// with a row under an unexpired lease, and claims run one after the other
// (Flavor.ClaimLock), so each sees the leases of the previous ones.
//
// What a claim reads: the unpublished rows in seq order until it has its
// heads (pending_idx; never the published rows the table keeps), one entry
// of aggregate_pending_idx per row scanned to tell whether it is a head,
// and per head its next row; with room for more than one row per
// aggregate, each head's range of aggregate_pending_idx up to the rows it
// takes. The rows an aggregate has waiting beyond those are never read.
// With fewer aggregates waiting than heads wanted, the scan reads every
// waiting row.

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/sqltime"
	"github.com/idem-go/idem/internal/outboxcodec"
)

// relay implements driver.RelayDialect for a Flavor.
type relay struct {
	f               *Flavor
	outbox, bySeq   string // the outbox, and its reference by seq (Flavor.BySeq)
	deletePublished string
	wrap            func(error) error

	claimHeads      string
	follower        string
	promoteDue      string
	nextDue         string
	backlog         string
	scheduled       string
	replayCounts    string
	replayRows      string
	listQuarantined string
	getQuarantined  string
}

// relayColumns are the columns scanRecord reads.
const relayColumns = `id, aggregatetype, aggregateid, type, payload, occurred_at,
    aggregate_version, headers, seq, created_at, attempts, content_type, payload_binary`

// quarantineWhere selects quarantined rows by event name, aggregate type and
// id, and quarantine time; see quarantineArgs. Quarantined rows are always
// unpublished: a row is quarantined by the worker that leases it, which frees
// the lease, and only a lease's owner marks a row published.
const quarantineWhere = `quarantined_at IS NOT NULL
  AND (? = '' OR type = ?)
  AND (? = '' OR aggregatetype = ?)
  AND (? = '' OR aggregateid = ?)
  AND (? IS NULL OR quarantined_at >= ?)`

// replayWhere selects published rows by period, event name and aggregate
// type; see replayArgs.
const replayWhere = `published_at IS NOT NULL
  AND (? IS NULL OR occurred_at >= ?)
  AND (? IS NULL OR occurred_at < ?)
  AND (? = '' OR type = ?)
  AND (? = '' OR aggregatetype = ?)`

// newRelay returns the relay operations of f on the outbox table o.
func newRelay(f *Flavor, o string, wrap func(error) error) *relay {
	return &relay{
		f:               f,
		outbox:          o,
		bySeq:           cmp.Or(f.BySeq, o),
		wrap:            wrap,
		deletePublished: f.DeleteOldest(o, "seq", "published_at < ?", "published_at"),
		// A quarantined row is never a head, and the rows after it in its
		// aggregate are not heads either: they have an unpublished row
		// before them.
		//
		// Every part reads only rows whose not_before is NULL: a delayed
		// row is invisible to the claim until promoteDue clears it, so it
		// holds back nothing of its aggregate (pending_idx and
		// aggregate_pending_idx leave such rows out: a partial index on
		// SQLite, not_before before seq on MySQL).
		// A row is a head when it is its aggregate's first unpublished row:
		// the check depends on the aggregate only, so MariaDB answers it
		// from its subquery cache for the rows of an aggregate seen before,
		// and reads the first entry of the aggregate's range otherwise.
		// Each head comes with the row after it (its seq, whether it was
		// leased and whether it is quarantined: it is not under a lease, or
		// the head would not be one), the first of the rows that follow.
		claimHeads: `SELECT h.seq, h.aggregatetype, h.aggregateid, h.taken,
    n.seq, COALESCE(n.lease_owner IS NOT NULL, 0), COALESCE(n.quarantined_at IS NOT NULL, 0)
FROM (
    SELECT o.seq, o.aggregatetype, o.aggregateid, o.lease_owner IS NOT NULL AS taken, (
        SELECT x.seq FROM ` + o + ` x` + f.AggregateHint + `
        WHERE x.aggregatetype = o.aggregatetype AND x.aggregateid = o.aggregateid
          AND x.published_at IS NULL AND x.not_before IS NULL AND x.seq > o.seq
        ORDER BY x.seq
        LIMIT 1) AS next_seq
    FROM ` + o + ` o` + f.PendingHint + `
    WHERE o.published_at IS NULL AND o.quarantined_at IS NULL AND o.not_before IS NULL
      AND (o.lease_until IS NULL OR o.lease_until <= ` + f.Now + `)
      AND o.seq = (
        SELECT p.seq FROM ` + o + ` p` + f.AggregateHint + `
        WHERE p.aggregatetype = o.aggregatetype AND p.aggregateid = o.aggregateid
          AND p.published_at IS NULL AND p.not_before IS NULL
        ORDER BY p.seq
        LIMIT 1)
      AND COALESCE((
        SELECT x.lease_until > ` + f.Now + ` FROM ` + o + ` x` + f.AggregateHint + `
        WHERE x.aggregatetype = o.aggregatetype AND x.aggregateid = o.aggregateid
          AND x.published_at IS NULL AND x.not_before IS NULL AND x.seq > o.seq
        ORDER BY x.seq
        LIMIT 1), 0) = 0
    ORDER BY o.seq
    LIMIT ?) h
LEFT JOIN ` + o + ` n ON n.seq = h.next_seq
ORDER BY h.seq`,
		// The rows that follow one head: a range of aggregate_pending_idx,
		// read up to the number of rows wanted, whatever the aggregate's
		// depth. followers joins one per head with UNION ALL.
		follower: f.UnionTerm(`SELECT ?, f.seq, f.lease_owner IS NOT NULL,
    COALESCE(f.lease_until > ` + f.Now + `, 0) OR f.quarantined_at IS NOT NULL
FROM ` + o + ` f` + f.AggregateHint + `
WHERE f.aggregatetype = ? AND f.aggregateid = ?
  AND f.published_at IS NULL AND f.not_before IS NULL AND f.seq > ?
ORDER BY f.seq
LIMIT ?`),
		// The delayed rows due at the relay's clock (the argument) become
		// ordinary waiting rows: a plain read of scheduled_idx finds them
		// without reading the others, then they are updated by seq. On
		// MySQL an UPDATE over the range would lock the gap before it,
		// where producers insert their undelayed rows.
		promoteDue: `SELECT seq FROM ` + o + `
WHERE published_at IS NULL AND not_before IS NOT NULL AND not_before <= ?
ORDER BY not_before
LIMIT ` + fmt.Sprint(Chunk),
		nextDue: `SELECT MIN(not_before) FROM ` + o + `
WHERE published_at IS NULL AND not_before IS NOT NULL`,
		scheduled: dialectkit.ScheduledSQL(o, f.Now),
		backlog: `SELECT
    (SELECT COUNT(*) FROM ` + o + ` WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL),
    (SELECT created_at FROM ` + o + ` WHERE published_at IS NULL AND quarantined_at IS NULL AND not_before IS NULL ORDER BY seq LIMIT 1),
    (SELECT COUNT(*) FROM ` + o + ` WHERE published_at IS NULL AND quarantined_at IS NOT NULL)`,
		replayCounts: `SELECT type, COUNT(*) FROM ` + o + `
WHERE ` + replayWhere + `
GROUP BY type
ORDER BY type`,
		replayRows: `SELECT ` + relayColumns + ` FROM ` + o + `
WHERE ` + replayWhere + `
  AND seq > ?
ORDER BY seq
LIMIT ?`,
		listQuarantined: `SELECT ` + relayColumns + `, quarantined_at, COALESCE(last_error, '')
FROM ` + o + `
WHERE ` + quarantineWhere + `
  AND seq > ?
ORDER BY seq
LIMIT ?`,
		getQuarantined: `SELECT ` + relayColumns + `, quarantined_at, COALESCE(last_error, '')
FROM ` + o + `
WHERE seq = ? AND quarantined_at IS NOT NULL`,
	}
}

// ClaimOutbox implements driver.RelayDialect.
func (r *relay) ClaimOutbox(ctx context.Context, ex driver.Executor, p driver.ClaimParams) ([]driver.ClaimedRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	if _, err := ex.Exec(ctx, r.f.ClaimLock); err != nil {
		return nil, r.wrap(err)
	}
	if err := r.promote(ctx, ex, p.DueAt()); err != nil {
		return nil, r.wrap(err)
	}
	type head struct {
		seq                        int64
		aggregateType, aggregateID string
		takenOver                  bool
		// next is the row after the head (not Valid: none), nextTaken
		// whether it was leased, nextQuarantined whether it is quarantined.
		next                       sql.NullInt64
		nextTaken, nextQuarantined bool
	}
	var heads []head
	err := driver.QueryRows(ctx, ex, r.claimHeads, []any{p.HeadLimit()}, func(rows driver.Rows) error {
		var h head
		if err := rows.Scan(&h.seq, &h.aggregateType, &h.aggregateID, &h.takenOver, &h.next, &h.nextTaken, &h.nextQuarantined); err != nil {
			return err
		}
		heads = append(heads, h)
		return nil
	})
	if err != nil {
		return nil, r.wrap(err)
	}
	if len(heads) > 0 && r.f.HeadsLock != "" {
		args := make([]any, len(heads))
		for i, h := range heads {
			args[i] = h.seq
		}
		locked := map[int64]bool{}
		err := driver.QueryRows(ctx, ex, `SELECT seq FROM `+r.bySeq+`
WHERE seq IN (`+Tuples(len(heads), "?")+`)
  AND published_at IS NULL AND quarantined_at IS NULL
  AND (lease_until IS NULL OR lease_until <= `+r.f.Now+`)
`+r.f.HeadsLock, args, func(rows driver.Rows) error {
			var seq int64
			if err := rows.Scan(&seq); err != nil {
				return err
			}
			locked[seq] = true
			return nil
		})
		if err != nil {
			return nil, r.wrap(err)
		}
		kept := heads[:0]
		for _, h := range heads {
			if locked[h.seq] {
				kept = append(kept, h)
			}
		}
		heads = kept
	}
	if len(heads) == 0 {
		return nil, nil
	}
	seqs := make([]any, 0, p.Limit)
	takenOver := make(map[int64]bool)
	for _, h := range heads {
		seqs = append(seqs, h.seq)
		if h.takenOver {
			takenOver[h.seq] = true
		}
	}

	// Fill the rest of the batch with the rows that follow the heads. Nobody
	// else can claim them: they are not heads, and their heads are ours. A
	// row still waiting for a retry delay, or quarantined, ends the run of
	// rows taken from its aggregate.
	room := p.Limit - len(heads)
	perAggregate := min(p.MaxPerAggregate-1, room/len(heads))
	switch {
	case perAggregate == 1:
		// The row after each head came with it.
		for _, h := range heads {
			if h.next.Valid && !h.nextQuarantined {
				seqs = append(seqs, h.next.Int64)
				if h.nextTaken {
					takenOver[h.next.Int64] = true
				}
			}
		}
	case perAggregate > 1:
		for start := 0; start < len(heads); start += followersChunk {
			part := heads[start:min(len(heads), start+followersChunk)]
			args := make([]any, 0, 5*len(part))
			for i, h := range part {
				args = append(args, i, h.aggregateType, h.aggregateID, h.seq, perAggregate)
			}
			type follower struct {
				seq         int64
				taken, busy bool
			}
			runs := make([][]follower, len(part))
			err := driver.QueryRows(ctx, ex, strings.Repeat(r.follower+"\nUNION ALL ", len(part)-1)+r.follower, args, func(rows driver.Rows) error {
				var (
					i int
					f follower
				)
				if err := rows.Scan(&i, &f.seq, &f.taken, &f.busy); err != nil {
					return err
				}
				if i < 0 || i >= len(runs) {
					return fmt.Errorf("follower of head %d of %d", i, len(runs))
				}
				runs[i] = append(runs[i], f)
				return nil
			})
			if err != nil {
				return nil, r.wrap(err)
			}
			for _, run := range runs {
				slices.SortFunc(run, func(a, b follower) int { return cmp.Compare(a.seq, b.seq) })
				for _, f := range run {
					if f.busy {
						break
					}
					seqs = append(seqs, f.seq)
					if f.taken {
						takenOver[f.seq] = true
					}
				}
			}
		}
	}

	in := Tuples(len(seqs), "?")
	args := append([]any{p.Owner.String(), r.f.DurationArg(p.Lease)}, seqs...)
	if _, err := ex.Exec(ctx, `UPDATE `+r.bySeq+` SET lease_owner = ?, lease_until = `+r.f.NowPlus+` WHERE seq IN (`+in+`)`, args...); err != nil {
		return nil, r.wrap(err)
	}
	out := make([]driver.ClaimedRow, 0, len(seqs))
	err = driver.QueryRows(ctx, ex, `SELECT `+relayColumns+` FROM `+r.outbox+` WHERE seq IN (`+in+`) ORDER BY seq`, seqs, func(rows driver.Rows) error {
		var c driver.ClaimedRow
		if err := scanRecord(rows, &c.OutboxRecord); err != nil {
			return err
		}
		c.TakenOver = takenOver[c.Seq]
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, r.wrap(err)
	}
	return out, nil
}

// followersChunk is the most heads whose followers one statement reads,
// one UNION ALL term each (SQLite takes at most 500 terms).
const followersChunk = 250

// promote clears not_before on the delayed rows due at now (at most Chunk
// of them; the next claim takes the rest).
func (r *relay) promote(ctx context.Context, ex driver.Executor, now time.Time) error {
	var seqs []int64
	err := driver.QueryRows(ctx, ex, r.promoteDue, []any{sqltime.Format(now)}, func(rows driver.Rows) error {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return err
		}
		seqs = append(seqs, seq)
		return nil
	})
	if err != nil || len(seqs) == 0 {
		return err
	}
	// created_at takes the due time: the row waits from then on. MySQL
	// assigns left to right, each assignment seeing the ones before.
	_, err = ex.Exec(ctx, `UPDATE `+r.bySeq+` SET created_at = not_before, not_before = NULL
WHERE seq IN (`+Tuples(len(seqs), "?")+`) AND published_at IS NULL AND not_before IS NOT NULL`, seqArgs(seqs)...)
	return err
}

// scanRecord scans the columns of relayColumns. TimeDest is a sql.Scanner:
// outboxcodec.ScanRow marks a row whose timestamp it cannot read unreadable
// instead of failing.
func scanRecord(rows driver.Rows, r *driver.OutboxRecord) error {
	return outboxcodec.ScanRow(rows, r, TimeDest)
}

func seqArgs(seqs []int64) []any {
	out := make([]any, len(seqs))
	for i, seq := range seqs {
		out[i] = seq
	}
	return out
}

// MarkPublished implements driver.RelayDialect.
func (r *relay) MarkPublished(ctx context.Context, ex driver.Executor, owner uuid.UUID, seqs []int64) (int64, error) {
	if len(seqs) == 0 {
		return 0, nil
	}
	n, err := ex.Exec(ctx, `UPDATE `+r.bySeq+`
SET published_at = `+r.f.Now+`, lease_owner = NULL, lease_until = NULL
WHERE lease_owner = ? AND seq IN (`+Tuples(len(seqs), "?")+`)`,
		append([]any{owner.String()}, seqArgs(seqs)...)...)
	return n, r.wrap(err)
}

// ReleaseOutbox implements driver.RelayDialect. Rows not
// attempted are released in one statement, failed ones one by one (each has
// its own error and delay).
func (r *relay) ReleaseOutbox(ctx context.Context, ex driver.Executor, owner uuid.UUID, rows []driver.ReleaseRow) (int64, error) {
	var (
		untried []int64
		total   int64
	)
	for _, row := range rows {
		if row.Error == "" {
			untried = append(untried, row.Seq)
			continue
		}
		attempt := 0
		if row.Refused {
			attempt = 1
		}
		n, err := ex.Exec(ctx, `UPDATE `+r.outbox+`
SET lease_owner = NULL, lease_until = `+r.f.NowPlus+`, attempts = attempts + ?, last_error = ?
WHERE seq = ? AND lease_owner = ?`,
			r.f.DurationArg(row.Delay), attempt, row.Error, row.Seq, owner.String())
		if err != nil {
			return total, r.wrap(err)
		}
		total += n
	}
	if len(untried) > 0 {
		n, err := ex.Exec(ctx, `UPDATE `+r.bySeq+`
SET lease_owner = NULL, lease_until = NULL
WHERE lease_owner = ? AND seq IN (`+Tuples(len(untried), "?")+`)`,
			append([]any{owner.String()}, seqArgs(untried)...)...)
		if err != nil {
			return total, r.wrap(err)
		}
		total += n
	}
	return total, nil
}

// QuarantineOutbox implements driver.RelayDialect, one row
// at a time (each has its own error; quarantines are rare).
func (r *relay) QuarantineOutbox(ctx context.Context, ex driver.Executor, owner uuid.UUID, rows []driver.QuarantineRow) ([]int64, error) {
	var out []int64
	for _, row := range rows {
		n, err := ex.Exec(ctx, `UPDATE `+r.outbox+`
SET lease_owner = NULL, lease_until = NULL, attempts = attempts + 1, last_error = ?, quarantined_at = `+r.f.Now+`
WHERE seq = ? AND lease_owner = ?`,
			row.Error, row.Seq, owner.String())
		if err != nil {
			return out, r.wrap(err)
		}
		if n == 1 {
			out = append(out, row.Seq)
		}
	}
	slices.Sort(out)
	return out, nil
}

func quarantineArgs(f driver.QuarantineFilter) []any {
	since := sqltime.Arg(f.Since)
	return []any{f.EventName, f.EventName, f.AggregateType, f.AggregateType, f.AggregateID, f.AggregateID, since, since}
}

// ListQuarantined implements driver.RelayDialect.
func (r *relay) ListQuarantined(ctx context.Context, ex driver.Executor, f driver.QuarantineFilter) ([]driver.QuarantinedRow, error) {
	out, err := dialectkit.QueryQuarantined(ctx, ex, r.listQuarantined, append(quarantineArgs(f), f.AfterSeq, f.PageLimit()), TimeDest)
	return out, r.wrap(err)
}

// GetQuarantined implements driver.RelayDialect.
func (r *relay) GetQuarantined(ctx context.Context, ex driver.Executor, seq int64) (driver.QuarantinedRow, error) {
	q, err := dialectkit.GetQuarantined(ctx, ex, r.getQuarantined, []any{seq}, TimeDest)
	return q, r.wrap(err)
}

// RequeueQuarantined implements driver.RelayDialect.
func (r *relay) RequeueQuarantined(ctx context.Context, ex driver.Executor, seqs []int64) (int64, error) {
	if len(seqs) == 0 {
		return 0, nil
	}
	n, err := ex.Exec(ctx, `UPDATE `+r.bySeq+`
SET quarantined_at = NULL, attempts = 0, lease_owner = NULL, lease_until = NULL
WHERE quarantined_at IS NOT NULL AND seq IN (`+Tuples(len(seqs), "?")+`)`, seqArgs(seqs)...)
	return n, r.wrap(err)
}

// DeleteQuarantined implements driver.RelayDialect.
func (r *relay) DeleteQuarantined(ctx context.Context, ex driver.Executor, seqs []int64) (int64, error) {
	if len(seqs) == 0 {
		return 0, nil
	}
	n, err := ex.Exec(ctx, `DELETE FROM `+r.outbox+`
WHERE quarantined_at IS NOT NULL AND seq IN (`+Tuples(len(seqs), "?")+`)`, seqArgs(seqs)...)
	return n, r.wrap(err)
}

// DeletePublished implements driver.RelayDialect.
func (r *relay) DeletePublished(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, r.deletePublished, sqltime.Format(before), limit)
	return n, r.wrap(err)
}

// OutboxBacklog implements driver.RelayDialect.
func (r *relay) OutboxBacklog(ctx context.Context, ex driver.Executor) (driver.Backlog, error) {
	var b driver.Backlog
	err := driver.QueryRow(ctx, ex, r.backlog, nil, &b.Rows, sqltime.Scanner(&b.Oldest), &b.Quarantined)
	if err != nil {
		return b, r.wrap(err)
	}
	sch, err := dialectkit.ReadScheduled(ctx, ex, r.scheduled, TimeDest)
	if err != nil {
		return b, r.wrap(err)
	}
	b.Scheduled, b.NextDue = sch.Merge(&b.Rows, &b.Oldest)
	return b, nil
}

// NextDue implements driver.RelayDialect.
func (r *relay) NextDue(ctx context.Context, ex driver.Executor) (time.Time, error) {
	var t time.Time
	err := driver.QueryRow(ctx, ex, r.nextDue, nil, sqltime.Scanner(&t))
	return t, r.wrap(err)
}

func replayArgs(f driver.ReplayFilter) []any {
	since, until := sqltime.Arg(f.Since), sqltime.Arg(f.Until)
	return []any{since, since, until, until, f.EventName, f.EventName, f.AggregateType, f.AggregateType}
}

// ReplayCounts implements driver.RelayDialect.
func (r *relay) ReplayCounts(ctx context.Context, ex driver.Executor, f driver.ReplayFilter) (map[string]int64, error) {
	out, err := dialectkit.QueryCounts(ctx, ex, r.replayCounts, replayArgs(f))
	return out, r.wrap(err)
}

// ReplayRows implements driver.RelayDialect.
func (r *relay) ReplayRows(ctx context.Context, ex driver.Executor, f driver.ReplayFilter, afterSeq int64, limit int) ([]driver.OutboxRecord, error) {
	out, err := dialectkit.QueryRecords(ctx, ex, r.replayRows, append(replayArgs(f), afterSeq, limit), TimeDest)
	return out, r.wrap(err)
}
