package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/sqlrelay"
)

var _ driver.RelayDialect = (*Dialect)(nil)

// nowText is the current time as the timestamp columns hold it.
const nowText = "strftime('%Y-%m-%d %H:%M:%f', 'now')"

// newRelay renders the relay's statements. SQLite has one writer at a time
// and no FOR UPDATE: a claim is plain reads and an UPDATE in a transaction
// that holds the write lock from its first statement (ClaimLock writes
// nothing but takes the lock even in a deferred transaction), so claims run
// one after the other and each sees the leases of the previous ones.
func newRelay(outbox string, wrap func(error) error) *sqlrelay.Relay {
	return sqlrelay.New(sqlrelay.Flavor{
		Outbox:      outbox,
		Now:         nowText,
		NowPlus:     "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)",
		DurationArg: func(d time.Duration) any { return fmt.Sprintf("%+.6f seconds", d.Seconds()) },
		ClaimLock:   "UPDATE " + outbox + " SET attempts = attempts WHERE 0",
		DeletePublished: `DELETE FROM ` + outbox + ` WHERE seq IN (
    SELECT seq FROM ` + outbox + `
    WHERE published_at < ?
    ORDER BY published_at
    LIMIT ?)`,
		Wrap: wrap,
	})
}

// ClaimOutbox implements driver.RelayDialect. It must run in a transaction;
// see newRelay for how claims are serialised.
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
