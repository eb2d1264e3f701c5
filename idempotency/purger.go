package idempotency

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/periodic"
)

// Purger deletes expired keys (Keys.Purge) at once, then every
// Config.PurgeInterval, as a long-running service with Start and Stop, so
// that idempotent_request stays small without a cron job.
type Purger[TTx any] struct {
	keys *Keys[TTx]
	log  *slog.Logger
	errs *errlog.Limiter
	loop periodic.Loop
}

// NewPurger returns a purger of k's expired keys.
func (k *Keys[TTx]) NewPurger() *Purger[TTx] {
	p := &Purger[TTx]{keys: k, log: k.log.With("component", "idempotency purger")}
	p.errs = errlog.New(p.log, "purge of expired idempotency keys", errlog.Config{})
	p.loop = periodic.Loop{Interval: k.cfg.PurgeInterval, Jitter: 0.1, Immediate: true, Run: p.RunOnce}
	return p
}

// Start starts purging in the background: once now, then every
// Config.PurgeInterval. ctx is not used after Start returns: the purger
// runs until Stop. It returns an error wrapping idem.ErrStarted or
// idem.ErrStopped when the purger was started or stopped before.
func (p *Purger[TTx]) Start(ctx context.Context) error {
	if err := p.loop.Start(); err != nil {
		return fmt.Errorf("idem: idempotency purger: %w", err)
	}
	return nil
}

// RunOnce purges once, now, and logs what it did. A failure is logged (its
// repeats once per interval, see package errlog), and the next round tries
// again.
func (p *Purger[TTx]) RunOnce(ctx context.Context) {
	n, err := p.keys.Purge(ctx)
	if err != nil {
		if ctx.Err() == nil {
			p.errs.Warn(ctx, "purge of expired idempotency keys failed; the next round tries again", err, "interval", p.keys.cfg.PurgeInterval)
		}
		return
	}
	p.errs.OK(ctx)
	if n > 0 {
		p.log.Info("expired idempotency keys purged", "deleted", n)
	}
}

// Stop stops purging and returns once a purge in progress has finished.
// When ctx ends first, the purge is cancelled and Stop returns ctx's error
// at once; Done is closed once the purge has returned. Stop is idempotent
// and safe to call from several goroutines.
func (p *Purger[TTx]) Stop(ctx context.Context) error { return p.loop.Stop(ctx) }

// Done is closed when the purger has stopped.
func (p *Purger[TTx]) Done() <-chan struct{} { return p.loop.Done() }
