package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/internal/outboxcodec"
)

var (
	_ driver.Dialect            = (*dialect)(nil)
	_ driver.OutboxListener     = (*PgxDriver)(nil)
	_ driver.OutboxWaitListener = (*PgxDriver)(nil)
	_ driver.OutboxClaimer      = (*PgxDriver)(nil)
)

// ClaimOutbox implements driver.RelayDialect. It takes a transaction-scoped
// advisory lock so that concurrent claims on the table run one after the
// other (each sees the leases of the previous ones), then, in one statement
// run with a snapshot taken after the lock (and after the delayed rows due
// at p.Now are made claimable), selects heads with FOR UPDATE
// SKIP LOCKED, adds the rows that follow them in their aggregates, and writes
// the lease.
func (d *dialect) ClaimOutbox(ctx context.Context, ex driver.Executor, p driver.ClaimParams) ([]driver.ClaimedRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	if _, err := ex.Exec(ctx, d.rq.claimLock); err != nil {
		return nil, d.Wrap(err)
	}
	if _, err := ex.Exec(ctx, d.rq.promoteDue, p.DueAt()); err != nil {
		return nil, d.Wrap(err)
	}
	rows, err := ex.Query(ctx, d.rq.claim, claimArgs(p)...)
	if err != nil {
		return nil, d.Wrap(err)
	}
	return d.scanClaimed(rows, p.Limit)
}

// ClaimOutbox implements driver.OutboxClaimer: it sends the statements of
// RelayDialect.ClaimOutbox in one pipeline, run by the server as one implicit
// transaction, so that a claim costs one round trip and the advisory lock is
// held only while the server runs them.
func (d *PgxDriver) ClaimOutbox(ctx context.Context, p driver.ClaimParams) ([]driver.ClaimedRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	b := &pgx.Batch{}
	b.Queue(d.dialect.rq.claimLock)
	b.Queue(d.dialect.rq.promoteDue, p.DueAt())
	b.Queue(d.dialect.rq.claim, claimArgs(p)...)
	br := d.pool.SendBatch(ctx, b)
	defer br.Close()
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return nil, d.dialect.Wrap(err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, d.dialect.Wrap(err)
	}
	out, err := d.dialect.scanClaimed(pgxRows{rows}, p.Limit)
	if err != nil {
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, d.dialect.Wrap(err)
	}
	return out, nil
}

func claimArgs(p driver.ClaimParams) []any {
	return []any{p.Limit, max(p.MaxPerAggregate-1, 0), p.Owner, p.Lease.Seconds(), p.HeadLimit()}
}

// scanClaimed reads the rows of the claim statement, in seq order.
func (d *dialect) scanClaimed(rows driver.Rows, limit int) ([]driver.ClaimedRow, error) {
	out := make([]driver.ClaimedRow, 0, min(limit, 256))
	err := driver.ScanRows(rows, func(rows driver.Rows) error {
		var c driver.ClaimedRow
		if err := outboxcodec.ScanRow(rows, &c.OutboxRecord, nil, &c.TakenOver); err != nil {
			return err
		}
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, d.Wrap(err)
	}
	return out, nil
}

// MarkPublished implements driver.RelayDialect.
func (d *dialect) MarkPublished(ctx context.Context, ex driver.Executor, owner uuid.UUID, seqs []int64) (int64, error) {
	if len(seqs) == 0 {
		return 0, nil
	}
	n, err := ex.Exec(ctx, d.rq.markPublished, owner, seqs)
	return n, d.Wrap(err)
}

// ReleaseOutbox implements driver.RelayDialect.
func (d *dialect) ReleaseOutbox(ctx context.Context, ex driver.Executor, owner uuid.UUID, rows []driver.ReleaseRow) (int64, error) {
	if len(rows) == 0 {
		return 0, nil
	}
	seqs := make([]int64, len(rows))
	errs := make([]string, len(rows))
	delays := make([]float64, len(rows))
	refused := make([]bool, len(rows))
	for i, r := range rows {
		seqs[i], errs[i], delays[i], refused[i] = r.Seq, r.Error, r.Delay.Seconds(), r.Refused
	}
	n, err := ex.Exec(ctx, d.rq.release, owner, seqs, errs, delays, refused)
	return n, d.Wrap(err)
}

// QuarantineOutbox implements driver.RelayDialect.
func (d *dialect) QuarantineOutbox(ctx context.Context, ex driver.Executor, owner uuid.UUID, rows []driver.QuarantineRow) ([]int64, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	seqs := make([]int64, len(rows))
	errs := make([]string, len(rows))
	for i, r := range rows {
		seqs[i], errs[i] = r.Seq, r.Error
	}
	var out []int64
	err := driver.QueryRows(ctx, ex, d.rq.quarantine, []any{owner, seqs, errs}, func(rows driver.Rows) error {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return err
		}
		out = append(out, seq)
		return nil
	})
	if err != nil {
		return nil, d.Wrap(err)
	}
	slices.Sort(out)
	return out, nil
}

// ListQuarantined implements driver.RelayDialect.
func (d *dialect) ListQuarantined(ctx context.Context, ex driver.Executor, f driver.QuarantineFilter) ([]driver.QuarantinedRow, error) {
	var since any
	if !f.Since.IsZero() {
		since = f.Since
	}
	out, err := dialectkit.QueryQuarantined(ctx, ex, d.rq.listQuarantined,
		[]any{f.EventName, f.AggregateType, f.AggregateID, since, f.AfterSeq, f.PageLimit()}, nil)
	return out, d.Wrap(err)
}

// GetQuarantined implements driver.RelayDialect.
func (d *dialect) GetQuarantined(ctx context.Context, ex driver.Executor, seq int64) (driver.QuarantinedRow, error) {
	q, err := dialectkit.GetQuarantined(ctx, ex, d.rq.getQuarantined, []any{seq}, nil)
	return q, d.Wrap(err)
}

// RequeueQuarantined implements driver.RelayDialect.
func (d *dialect) RequeueQuarantined(ctx context.Context, ex driver.Executor, seqs []int64) (int64, error) {
	if len(seqs) == 0 {
		return 0, nil
	}
	n, err := ex.Exec(ctx, d.rq.requeueQuarantined, seqs)
	return n, d.Wrap(err)
}

// DeleteQuarantined implements driver.RelayDialect.
func (d *dialect) DeleteQuarantined(ctx context.Context, ex driver.Executor, seqs []int64) (int64, error) {
	if len(seqs) == 0 {
		return 0, nil
	}
	n, err := ex.Exec(ctx, d.rq.deleteQuarantined, seqs)
	return n, d.Wrap(err)
}

// DeletePublished implements driver.RelayDialect.
func (d *dialect) DeletePublished(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.rq.deletePublished, before, limit)
	return n, d.Wrap(err)
}

// OutboxBacklog implements driver.RelayDialect.
func (d *dialect) OutboxBacklog(ctx context.Context, ex driver.Executor) (driver.Backlog, error) {
	var (
		b      driver.Backlog
		oldest *time.Time
	)
	if err := driver.QueryRow(ctx, ex, d.rq.backlog, nil, &b.Rows, &oldest, &b.Quarantined); err != nil {
		return b, d.Wrap(err)
	}
	if oldest != nil {
		b.Oldest = *oldest
	}
	sch, err := dialectkit.ReadScheduled(ctx, ex, d.rq.scheduled, dialectkit.NullTime)
	if err != nil {
		return b, d.Wrap(err)
	}
	b.Scheduled, b.NextDue = sch.Merge(&b.Rows, &b.Oldest)
	return b, nil
}

// NextDue implements driver.RelayDialect.
func (d *dialect) NextDue(ctx context.Context, ex driver.Executor) (time.Time, error) {
	var t time.Time
	err := driver.QueryRow(ctx, ex, d.rq.nextDue, nil, dialectkit.NullTime(&t))
	return t, d.Wrap(err)
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
func (d *dialect) ReplayCounts(ctx context.Context, ex driver.Executor, f driver.ReplayFilter) (map[string]int64, error) {
	out, err := dialectkit.QueryCounts(ctx, ex, d.rq.replayCounts, replayArgs(f))
	return out, d.Wrap(err)
}

// ReplayRows implements driver.RelayDialect.
func (d *dialect) ReplayRows(ctx context.Context, ex driver.Executor, f driver.ReplayFilter, afterSeq int64, limit int) ([]driver.OutboxRecord, error) {
	out, err := dialectkit.QueryRecords(ctx, ex, d.rq.replayRows, append(replayArgs(f), afterSeq, limit), nil)
	return out, d.Wrap(err)
}

// ListenOutbox implements driver.OutboxListener with LISTEN on the channel
// the outbox trigger notifies (dialect.OutboxChannel). It holds one
// connection of the pool, taken out of the pool for good, and on it, as
// soon as it can take it, the lock that says a relay waits, for good too:
// every insert then notifies (see ListenOutboxWaiting). It calls notify
// once listening, and again once it holds the lock.
func (d *PgxDriver) ListenOutbox(ctx context.Context, notify func()) error {
	conn, err := d.listenConn(ctx)
	if err != nil {
		return err
	}
	defer closeConn(ctx, conn)
	notify()
	held := false
	for {
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if !held {
			// Inserting transactions hold the lock shared, and another
			// listener may hold it: try again shortly, meanwhile receive
			// the notifications that others' lock makes producers send.
			var ok bool
			if err := conn.QueryRow(ctx, d.dialect.rq.waitTryLock).Scan(&ok); err != nil {
				return err
			}
			if ok {
				held = true
				notify()
			} else {
				wctx, cancel = context.WithTimeout(ctx, listenLockRetry)
			}
		}
		_, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			notify()
		case ctx.Err() == nil && wctx.Err() != nil:
			// The retry's timeout: the connection is still usable.
		default:
			return err
		}
	}
}

// listenLockRetry is how often ListenOutbox tries to take the wait lock
// until it holds it.
const listenLockRetry = 100 * time.Millisecond

// ListenOutboxWaiting implements driver.OutboxWaitListener. Since
// migration 0006 the outbox trigger notifies only while a session holds
// the advisory lock (7194, the outbox's oid); other inserts take it shared
// until their transaction ends. On a second connection taken out of the
// pool, ListenOutboxWaiting takes that lock when the relay reports that it
// is idle (it waits for the transactions that hold it shared, which
// inserted rows without notifying, to end), then looks whether a claim
// could find rows, and calls notify only if so. It looks again at every
// later report while it holds the lock: a batch just marked may have made
// the next row of its aggregate a head. It gives the lock back at the first
// notification: the relay is then busy, and claims until a claim finds
// nothing again. Producers therefore notify only while the relay waits, a
// row is never left behind by a wake-up, and a relay that keeps up claims
// once per wake-up, not once more for nothing after each batch.
func (d *PgxDriver) ListenOutboxWaiting(ctx context.Context, notify func(), idle <-chan struct{}) error {
	conn, err := d.listenConn(ctx)
	if err != nil {
		return err
	}
	defer closeConn(ctx, conn)
	pooled, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	lockConn := pooled.Hijack()
	defer closeConn(ctx, lockConn)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	release := make(chan struct{}, 1)
	waitErr := make(chan error, 1)
	go func() {
		waitErr <- d.holdWhileIdle(ctx, lockConn, notify, idle, release)
		cancel()
	}()
	notify()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			cancel()
			if werr := <-waitErr; werr != nil && !errors.Is(werr, context.Canceled) {
				return werr // the lock's connection failed first
			}
			return err
		}
		select {
		case release <- struct{}{}:
		default:
		}
		notify()
	}
}

// holdWhileIdle takes the wait lock on conn when the relay reports that it
// is idle, then calls notify if a claim could find rows; it gives the lock
// back on release. Releases go first: a report of idleness older than a
// notification must not keep the lock after it.
func (d *PgxDriver) holdWhileIdle(ctx context.Context, conn *pgx.Conn, notify func(), idle, release <-chan struct{}) error {
	held := false
	unlock := func() error {
		if !held {
			return nil
		}
		held = false
		_, err := conn.Exec(ctx, d.dialect.rq.waitUnlock)
		return err
	}
	for {
		select {
		case <-release:
			if err := unlock(); err != nil {
				return err
			}
			continue
		default:
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-release:
			if err := unlock(); err != nil {
				return err
			}
		case <-idle:
			rows, err := d.lockAndCheck(ctx, conn, !held)
			if err != nil {
				return err
			}
			held = true
			if rows {
				notify()
			}
		}
	}
}

// lockAndCheck takes the wait lock when lock is set, then runs the check,
// in one round trip: the check is a statement of its own, so its snapshot
// is taken once the lock is held, after every transaction that inserted
// without notifying has ended.
func (d *PgxDriver) lockAndCheck(ctx context.Context, conn *pgx.Conn, lock bool) (bool, error) {
	var b pgx.Batch
	if lock {
		b.Queue(d.dialect.rq.waitLock)
	}
	var rows bool
	b.Queue(d.dialect.rq.waitCheck).QueryRow(func(r pgx.Row) error { return r.Scan(&rows) })
	if err := conn.SendBatch(ctx, &b).Close(); err != nil {
		return false, err
	}
	return rows, nil
}

// listenConn takes a connection out of the pool for good and listens on the
// outbox's channel with it.
func (d *PgxDriver) listenConn(ctx context.Context) (*pgx.Conn, error) {
	pooled, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pooled.Hijack()
	var schema *string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		closeConn(ctx, conn)
		return nil, err
	}
	if schema == nil {
		closeConn(ctx, conn)
		return nil, fmt.Errorf("idem: listen: the connection has no current schema (check search_path)")
	}
	channel := d.dialect.OutboxChannel(*schema)
	if _, err := conn.Exec(ctx, "LISTEN "+QuoteIdent(channel)); err != nil {
		closeConn(ctx, conn)
		return nil, err
	}
	return conn, nil
}

// closeConn closes a connection taken out of the pool, which ends its
// session and so gives back its session locks.
func closeConn(ctx context.Context, conn *pgx.Conn) {
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = conn.Close(closeCtx)
}
