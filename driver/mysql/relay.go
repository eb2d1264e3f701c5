package mysql

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/sqlrelay"
)

var _ driver.RelayDialect = (*Dialect)(nil)

// relayQueries is the polling relay's SQL for MySQL.
type relayQueries = *sqlrelay.Relay

// newRelayQueries renders the relay's statements. Claims lock the single row
// of the claim-lock table first: claims run one after the other, and each
// reads (InnoDB creates a transaction's snapshot at its first plain read,
// after the lock) the leases of every claim committed before it. The heads
// found are then locked by primary key with FOR UPDATE SKIP LOCKED and
// rechecked; no range of pending rows is locked, so producers inserting
// rows never deadlock with a claim: every lookup by seq goes through the
// seq index, never a range of pending_idx. MySQL has no LISTEN/NOTIFY: relays
// poll (relay.Config.PollInterval, jittered).
func newRelayQueries(outbox, claimLock string) relayQueries {
	// outbox is `schema`.`table` or `table`, of names without backquotes
	// (idem.Tables.Validate).
	table := strings.Trim(outbox[strings.LastIndex(outbox, ".")+1:], "`")
	return sqlrelay.New(sqlrelay.Flavor{
		Outbox:      outbox,
		BySeq:       outbox + " FORCE INDEX (" + QuoteIdent(table+"_seq_idx") + ")",
		Now:         "UTC_TIMESTAMP(6)",
		NowPlus:     "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND",
		DurationArg: func(d time.Duration) any { return d.Microseconds() },
		ClaimLock:   "UPDATE " + claimLock + " SET id = id WHERE id = 1",
		HeadsLock:   "FOR UPDATE SKIP LOCKED",
		DeletePublished: `DELETE FROM ` + outbox + `
WHERE published_at < ?
ORDER BY published_at
LIMIT ?`,
		Wrap: wrapErr,
	})
}

func wrapErr(err error) error { return (*Dialect)(nil).wrap(err) }

// ClaimOutbox implements driver.RelayDialect. It must run in a transaction
// (the lease and the claim lock last until it ends).
func (d *Dialect) ClaimOutbox(ctx context.Context, ex driver.Executor, p driver.ClaimParams) ([]driver.ClaimedRow, error) {
	return d.rq.ClaimOutbox(ctx, ex, p)
}

// MarkPublished implements driver.RelayDialect.
func (d *Dialect) MarkPublished(ctx context.Context, ex driver.Executor, owner uuid.UUID, seqs []int64) (int64, error) {
	return d.rq.MarkPublished(ctx, ex, owner, seqs)
}

// ReleaseOutbox implements driver.RelayDialect.
func (d *Dialect) ReleaseOutbox(ctx context.Context, ex driver.Executor, owner uuid.UUID, rows []driver.ReleaseRow) (int64, error) {
	return d.rq.ReleaseOutbox(ctx, ex, owner, rows)
}

// QuarantineOutbox implements driver.RelayDialect.
func (d *Dialect) QuarantineOutbox(ctx context.Context, ex driver.Executor, owner uuid.UUID, rows []driver.QuarantineRow) ([]int64, error) {
	return d.rq.QuarantineOutbox(ctx, ex, owner, rows)
}

// ListQuarantined implements driver.RelayDialect.
func (d *Dialect) ListQuarantined(ctx context.Context, ex driver.Executor, f driver.QuarantineFilter) ([]driver.QuarantinedRow, error) {
	return d.rq.ListQuarantined(ctx, ex, f)
}

// GetQuarantined implements driver.RelayDialect.
func (d *Dialect) GetQuarantined(ctx context.Context, ex driver.Executor, seq int64) (driver.QuarantinedRow, error) {
	return d.rq.GetQuarantined(ctx, ex, seq)
}

// RequeueQuarantined implements driver.RelayDialect.
func (d *Dialect) RequeueQuarantined(ctx context.Context, ex driver.Executor, seqs []int64) (int64, error) {
	return d.rq.RequeueQuarantined(ctx, ex, seqs)
}

// DeleteQuarantined implements driver.RelayDialect.
func (d *Dialect) DeleteQuarantined(ctx context.Context, ex driver.Executor, seqs []int64) (int64, error) {
	return d.rq.DeleteQuarantined(ctx, ex, seqs)
}

// DeletePublished implements driver.RelayDialect.
func (d *Dialect) DeletePublished(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int64, error) {
	return d.rq.DeletePublished(ctx, ex, before, limit)
}

// OutboxBacklog implements driver.RelayDialect.
func (d *Dialect) OutboxBacklog(ctx context.Context, ex driver.Executor) (driver.Backlog, error) {
	return d.rq.OutboxBacklog(ctx, ex)
}

// ReplayCounts implements driver.RelayDialect.
func (d *Dialect) ReplayCounts(ctx context.Context, ex driver.Executor, f driver.ReplayFilter) (map[string]int64, error) {
	return d.rq.ReplayCounts(ctx, ex, f)
}

// ReplayRows implements driver.RelayDialect.
func (d *Dialect) ReplayRows(ctx context.Context, ex driver.Executor, f driver.ReplayFilter, afterSeq int64, limit int) ([]driver.OutboxRecord, error) {
	return d.rq.ReplayRows(ctx, ex, f, afterSeq, limit)
}
