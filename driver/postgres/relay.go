package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/driver"
)

var (
	_ driver.RelayDialect   = (*Dialect)(nil)
	_ driver.OutboxListener = (*PgxDriver)(nil)
	_ driver.OutboxClaimer  = (*PgxDriver)(nil)
)

// ClaimOutbox implements driver.RelayDialect. It takes a transaction-scoped
// advisory lock so that concurrent claims on the table run one after the
// other (each sees the leases of the previous ones), then, in one statement
// run with a snapshot taken after the lock, selects heads with FOR UPDATE
// SKIP LOCKED, adds the rows that follow them in their aggregates, and writes
// the lease.
func (d *Dialect) ClaimOutbox(ctx context.Context, ex driver.Executor, p driver.ClaimParams) ([]driver.ClaimedRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	if _, err := ex.Exec(ctx, d.rq.claimLock); err != nil {
		return nil, d.wrap(err)
	}
	rows, err := ex.Query(ctx, d.rq.claim, claimArgs(p)...)
	if err != nil {
		return nil, d.wrap(err)
	}
	return d.scanClaimed(rows, p.Limit)
}

// ClaimOutbox implements driver.OutboxClaimer: it sends the statements of
// Dialect.ClaimOutbox in one pipeline, run by the server as one implicit
// transaction, so that a claim costs one round trip and the advisory lock is
// held only while the server runs them.
func (d *PgxDriver) ClaimOutbox(ctx context.Context, p driver.ClaimParams) ([]driver.ClaimedRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	b := &pgx.Batch{}
	b.Queue(d.dialect.rq.claimLock)
	b.Queue(d.dialect.rq.claim, claimArgs(p)...)
	br := d.pool.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, d.dialect.wrap(err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, d.dialect.wrap(err)
	}
	out, err := d.dialect.scanClaimed(pgxRows{rows}, p.Limit)
	if err != nil {
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, d.dialect.wrap(err)
	}
	return out, nil
}

func claimArgs(p driver.ClaimParams) []any {
	return []any{p.Limit, max(p.MaxPerAggregate-1, 0), p.Owner, p.Lease.Seconds(), p.HeadLimit()}
}

// scanClaimed reads the rows of the claim statement, in seq order.
func (d *Dialect) scanClaimed(rows driver.Rows, limit int) ([]driver.ClaimedRow, error) {
	out := make([]driver.ClaimedRow, 0, min(limit, 256))
	err := driver.ScanRows(rows, func(rows driver.Rows) error {
		var c driver.ClaimedRow
		if err := driver.ScanOutboxRecord(rows, &c.OutboxRecord, nil, &c.TakenOver); err != nil {
			return err
		}
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, d.wrap(err)
	}
	return out, nil
}

// scanRecord scans the columns of relayColumns.
func scanRecord(rows driver.Rows, r *driver.OutboxRecord) error {
	return driver.ScanOutboxRecord(rows, r, nil)
}

func uuidStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// MarkPublished implements driver.RelayDialect.
func (d *Dialect) MarkPublished(ctx context.Context, ex driver.Executor, owner uuid.UUID, ids []uuid.UUID) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	n, err := ex.Exec(ctx, d.rq.markPublished, owner, uuidStrings(ids))
	return n, d.wrap(err)
}

// ReleaseOutbox implements driver.RelayDialect.
func (d *Dialect) ReleaseOutbox(ctx context.Context, ex driver.Executor, owner uuid.UUID, rows []driver.ReleaseRow) (int64, error) {
	if len(rows) == 0 {
		return 0, nil
	}
	ids := make([]string, len(rows))
	errs := make([]string, len(rows))
	delays := make([]float64, len(rows))
	for i, r := range rows {
		ids[i], errs[i], delays[i] = r.ID.String(), r.Error, r.Delay.Seconds()
	}
	n, err := ex.Exec(ctx, d.rq.release, owner, ids, errs, delays)
	return n, d.wrap(err)
}

// DeletePublished implements driver.RelayDialect.
func (d *Dialect) DeletePublished(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.rq.deletePublished, before, limit)
	return n, d.wrap(err)
}

// OutboxBacklog implements driver.RelayDialect.
func (d *Dialect) OutboxBacklog(ctx context.Context, ex driver.Executor) (driver.Backlog, error) {
	var (
		b      driver.Backlog
		oldest *time.Time
	)
	if err := driver.QueryRow(ctx, ex, d.rq.backlog, nil, &b.Rows, &oldest); err != nil {
		return b, d.wrap(err)
	}
	if oldest != nil {
		b.Oldest = *oldest
	}
	return b, nil
}

func replayArgs(f driver.ReplayFilter) []any {
	var since, until any
	if !f.Since.IsZero() {
		since = f.Since
	}
	if !f.Until.IsZero() {
		until = f.Until
	}
	return []any{since, until, f.EventName, f.AggregateType}
}

// ReplayCounts implements driver.RelayDialect.
func (d *Dialect) ReplayCounts(ctx context.Context, ex driver.Executor, f driver.ReplayFilter) (map[string]int64, error) {
	out := map[string]int64{}
	err := driver.QueryRows(ctx, ex, d.rq.replayCounts, replayArgs(f), func(rows driver.Rows) error {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return err
		}
		out[name] = n
		return nil
	})
	if err != nil {
		return nil, d.wrap(err)
	}
	return out, nil
}

// ReplayRows implements driver.RelayDialect.
func (d *Dialect) ReplayRows(ctx context.Context, ex driver.Executor, f driver.ReplayFilter, afterSeq int64, limit int) ([]driver.OutboxRecord, error) {
	var out []driver.OutboxRecord
	err := driver.QueryRows(ctx, ex, d.rq.replayRows, append(replayArgs(f), afterSeq, limit), func(rows driver.Rows) error {
		var r driver.OutboxRecord
		if err := scanRecord(rows, &r); err != nil {
			return err
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, d.wrap(err)
	}
	return out, nil
}

// ListenOutbox implements driver.OutboxListener with LISTEN on the channel
// the outbox trigger notifies (Dialect.OutboxChannel). It holds one
// connection of the pool, taken out of the pool for good.
func (d *PgxDriver) ListenOutbox(ctx context.Context, notify func()) error {
	pooled, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pooled.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	var schema *string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return err
	}
	if schema == nil {
		return fmt.Errorf("idem: listen: the connection has no current schema (check search_path)")
	}
	channel := d.dialect.OutboxChannel(*schema)
	if _, err := conn.Exec(ctx, "LISTEN "+QuoteIdent(channel)); err != nil {
		return err
	}
	notify()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		notify()
	}
}
