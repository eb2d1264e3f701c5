package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/startstop"
)

// Purger deletes expired keys (Keys.Purge) at once, then every
// Config.PurgeInterval, as a long-running service with Start and Stop, so
// that idempotent_request stays small without a cron job.
type Purger[TTx any] struct {
	keys   *Keys[TTx]
	log    *slog.Logger
	errs   *errlog.Limiter
	base   startstop.Base
	ctx    context.Context
	cancel context.CancelFunc
}

// NewPurger returns a purger of k's expired keys.
func (k *Keys[TTx]) NewPurger() *Purger[TTx] {
	p := &Purger[TTx]{keys: k, log: k.log.With("component", "idempotency purger")}
	p.errs = errlog.New(p.log, "purge of expired idempotency keys", errlog.Config{})
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// Start starts purging in the background: once now, then every
// Config.PurgeInterval. ctx is not used after Start returns: the purger
// runs until Stop.
func (p *Purger[TTx]) Start(ctx context.Context) error {
	if err := p.base.Starting(); err != nil {
		return fmt.Errorf("idempotency: purger: %w", err)
	}
	go func() {
		defer p.base.Finished()
		for {
			p.RunOnce(p.ctx)
			interval := p.keys.cfg.PurgeInterval
			t := time.NewTimer(time.Duration(float64(interval) * (0.9 + 0.2*rand.Float64())))
			select {
			case <-p.base.Stopping():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}()
	p.base.Running()
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

// Stop stops purging; a purge in progress finishes, unless ctx ends first,
// which cancels it. Stop returns when the purger has stopped; it is
// idempotent and safe to call from several goroutines.
func (p *Purger[TTx]) Stop(ctx context.Context) error {
	err := p.base.Stop(ctx, nil, p.cancel)
	p.cancel()
	return err
}

// Done is closed when a started purger has stopped.
func (p *Purger[TTx]) Done() <-chan struct{} { return p.base.Done() }
