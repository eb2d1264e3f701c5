package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/backoff"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/relay/internal/ordered"
	"github.com/idem-go/idem/relay/logrelay"
)

// settle records what became of a batch's rows, fenced by the batch's
// owner: it marks the published rows, quarantines the rows that cannot be
// read and those the broker refused on their last allowed attempt, and
// releases the rest (with a delay for those that failed). faultDelay is the
// wait of rows the broker did not answer for; down says that the broker
// failed as a whole, which brokerFailed has logged.
func (r *Relay[TTx]) settle(log *slog.Logger, b *claimed, items []item, faultDelay time.Duration, down bool) {
	owner, deadline := b.owner, b.deadline
	var seqs []int64
	for i := range items {
		if items[i].outcome == ordered.Published {
			seqs = append(seqs, items[i].row.Seq)
		}
	}
	if len(seqs) > 0 {
		if fault.Enabled {
			fault.Point(fault.RelayAfterPublishBeforeMark)
		}
		marked, err := r.mark(owner, deadline, seqs)
		if errors.Is(err, errLeaseExpired) {
			r.stats.leasesLost.Add(int64(len(seqs)))
			log.Warn("lease expired before the mark: the rows will be published again by their next owner", "rows", len(seqs))
		} else if err != nil {
			r.errs.mark.Error(r.workCtx, "mark published failed; the rows will be published again after the lease", err, "rows", len(seqs))
		} else {
			r.errs.mark.OK(r.workCtx)
			r.stats.published.Add(marked)
			if lost := int64(len(seqs)) - marked; lost > 0 {
				r.stats.leasesLost.Add(lost)
				log.Warn("lease lost: rows were taken over by another worker, which publishes them again", "rows", lost)
			}
			if r.cfg.Observer.Delay != nil && marked == int64(len(seqs)) {
				for i := range items {
					if items[i].outcome == ordered.Published && !items[i].row.CreatedAt.IsZero() {
						r.cfg.Observer.Delay(items[i].confirmed.Sub(items[i].row.CreatedAt))
					}
				}
			}
		}
		if fault.Enabled {
			fault.Point(fault.RelayAfterMark)
		}
	}

	var (
		release              []driver.ReleaseRow
		quarantine           []driver.QuarantineRow
		refused, faultCount  int64
		firstRefused, anyErr error
	)
	for i := range items {
		it := &items[i]
		switch {
		case it.unreadable:
			quarantine = append(quarantine, driver.QuarantineRow{Seq: it.row.Seq, Error: it.err.Error()})
		case it.outcome == ordered.Published:
		case it.outcome == ordered.Unsent:
			// Not attempted, or stopped in flight.
			release = append(release, driver.ReleaseRow{Seq: it.row.Seq})
		case it.outcome == ordered.Fault:
			faultCount++
			anyErr = cmp.Or(anyErr, it.err)
			release = append(release, driver.ReleaseRow{Seq: it.row.Seq, Error: it.err.Error(), Delay: faultDelay})
		case it.outcome == ordered.Quarantined:
			refused++
			firstRefused = cmp.Or(firstRefused, it.err)
			quarantine = append(quarantine, driver.QuarantineRow{Seq: it.row.Seq,
				Error: fmt.Sprintf("refused by the broker on %d attempts; last: %v", it.row.Attempts+1, it.err)})
		default: // ordered.Refused
			refused++
			firstRefused = cmp.Or(firstRefused, it.err)
			attempts := it.row.Attempts + 1
			release = append(release, driver.ReleaseRow{Seq: it.row.Seq, Error: it.err.Error(),
				Delay: r.retryDelay(attempts), Refused: true})
		}
	}
	if n := refused + faultCount; n > 0 {
		r.stats.publishErrors.Add(n)
	}
	if refused > 0 {
		log.Warn("the broker refused rows; they will be retried, and quarantined after Config.QuarantineAfter attempts",
			"rows", refused, "error", firstRefused)
	}
	if faultCount > 0 && !down && !errors.Is(anyErr, context.Canceled) {
		r.errs.publish.Warn(r.workCtx, "the broker did not confirm rows; they will be retried", anyErr, "rows", faultCount)
	}
	if len(quarantine) > 0 {
		r.quarantine(log, owner, items, quarantine)
	}
	if len(release) > 0 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.workCtx), releaseTimeout)
		n, err := r.dialect.ReleaseOutbox(ctx, r.drv.Pool(), owner, release)
		cancel()
		if err != nil {
			r.errs.release.Error(r.workCtx, "release failed; the rows wait for their lease to expire", err, "rows", len(release))
		} else {
			r.errs.release.OK(r.workCtx)
			r.stats.released.Add(n)
		}
	}
}

// quarantine sets rows aside and logs each of them.
func (r *Relay[TTx]) quarantine(log *slog.Logger, owner uuid.UUID, items []item, rows []driver.QuarantineRow) {
	reasons := make(map[int64]string, len(rows))
	for _, q := range rows {
		reasons[q.Seq] = q.Error
	}
	bySeq := make(map[int64]*driver.ClaimedRow, len(items))
	for i := range items {
		bySeq[items[i].row.Seq] = items[i].row
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.workCtx), releaseTimeout)
	done, err := r.quarantineRows(ctx, owner, rows, bySeq, reasons)
	cancel()
	if err != nil {
		r.errs.quarantine.Error(r.workCtx, "quarantine failed; the rows are tried again after their lease", err, "rows", len(rows))
		return
	}
	r.errs.quarantine.OK(r.workCtx)
	r.stats.quarantined.Add(int64(len(done)))
	if lost := len(rows) - len(done); lost > 0 {
		r.stats.leasesLost.Add(int64(lost))
		log.Warn("lease lost: rows to quarantine were taken over by another worker", "rows", lost)
	}
	for _, seq := range done {
		row := bySeq[seq]
		log.Error("outbox row quarantined: it is not published, and the later rows of its aggregate wait behind it; "+
			"see \"idem failed show --relay\", then retry or remove it",
			"seq", seq, "id", row.RawID, "aggregate_type", row.AggregateType, "aggregate_id", row.AggregateID,
			"event", row.Type, "attempts", row.Attempts+1, "error", reasons[seq])
	}
}

// errLeaseExpired is why a mark is not sent once its lease has ended.
var errLeaseExpired = errors.New("the lease expired before the mark")

// mark marks the rows of seqs published, retrying while the lease lasts. It
// sends no mark once deadline, the lease's end as measured from before the
// claim, has passed: the rows may be another owner's by then.
func (r *Relay[TTx]) mark(owner uuid.UUID, deadline time.Time, seqs []int64) (int64, error) {
	defer observeSince(r.cfg.Observer.Mark, time.Now())
	var err error
	for attempt := 1; ; attempt++ {
		if !time.Now().Before(deadline) {
			return 0, cmp.Or(err, errLeaseExpired)
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.workCtx), min(r.cfg.QueryTimeout, time.Until(deadline)))
		var n int64
		n, err = r.dialect.MarkPublished(ctx, r.drv.Pool(), owner, seqs)
		cancel()
		if err == nil {
			return n, nil
		}
		if attempt == markAttempts || time.Until(deadline) < r.cfg.leaseMargin() || r.workCtx.Err() != nil {
			return 0, err
		}
		if !ctxsleep.Sleep(r.workCtx, backoff.Exponential(10*time.Millisecond, time.Second, attempt)) {
			return 0, err
		}
	}
}

// brokerFailed pauses every worker after a whole Publish call failed, and
// returns the pause.
func (r *Relay[TTx]) brokerFailed(err error) time.Duration {
	n := r.brokerFailures.Add(1)
	d := r.retryDelay(int(n))
	until := time.Now().Add(d).UnixNano()
	for {
		cur := r.pauseUntil.Load()
		if cur >= until || r.pauseUntil.CompareAndSwap(cur, until) {
			break
		}
	}
	if !errors.Is(err, context.Canceled) {
		r.errs.publish.Warn(r.workCtx, "broker failed; pausing", err, "pause", d.Round(time.Millisecond), "failures_in_a_row", n)
	}
	return d
}

// retryDelay returns the wait before the attempt-th retry of a row.
func (r *Relay[TTx]) retryDelay(attempt int) time.Duration {
	return backoff.Exponential(r.cfg.RetryBackoff, r.cfg.MaxRetryBackoff, attempt)
}

// quarantineRows quarantines rows, with the notice of each
// (Config.OnQuarantine) in the same transaction when there is a hook;
// bySeq and reasons are the rows claimed and why each is set aside.
func (r *Relay[TTx]) quarantineRows(ctx context.Context, owner uuid.UUID, rows []driver.QuarantineRow,
	bySeq map[int64]*driver.ClaimedRow, reasons map[int64]string) ([]int64, error) {
	if r.cfg.OnQuarantine == nil {
		return r.dialect.QuarantineOutbox(ctx, r.drv.Pool(), owner, rows)
	}
	var done []int64
	err := driver.InTx(ctx, r.drv, func(ex driver.Executor) error {
		var err error
		if done, err = r.dialect.QuarantineOutbox(ctx, ex, owner, rows); err != nil {
			return err
		}
		for _, seq := range done {
			row := bySeq[seq]
			if row == nil || idem.IsFailureNotice(row.Type) {
				continue
			}
			if err := r.cfg.OnQuarantine(ctx, ex, logrelay.QuarantineNotice(r.dialect.Tables().Outbox, row.OutboxRecord, reasons[seq])); err != nil {
				return fmt.Errorf("idem: relay: quarantine hook: %w", err)
			}
		}
		return nil
	})
	return done, err
}
