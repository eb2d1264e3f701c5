// Package archivepurge deletes what the CDC relays archived longer ago than
// their retention (the archive "idem replay" reads), for relay/cdc and
// relay/binlog alike, from their periodic loops.
package archivepurge

import (
	"context"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/errlog"
)

// Run deletes the events a archived (through ex) before before, batch at
// a time, each statement bounded by timeout, until a batch comes back
// short, ctx ends or stopping is closed (a Stop ends it between batches).
// deleted is told each batch's count. A failure is reported to lim and
// left to the next run.
func Run(ctx context.Context, stopping <-chan struct{}, a driver.OutboxArchiver, ex driver.Executor,
	before time.Time, batch int, timeout time.Duration, lim *errlog.Limiter, deleted func(int64)) {
	for ctx.Err() == nil {
		select {
		case <-stopping:
			return
		default:
		}
		qctx, cancel := context.WithTimeout(ctx, timeout)
		n, err := a.PurgeArchive(qctx, ex, before, batch)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				lim.Warn(ctx, "deleting the events archived longer ago than the archive's retention failed", err)
			}
			return
		}
		lim.OK(ctx)
		deleted(n)
		if n < int64(batch) {
			return
		}
	}
}
