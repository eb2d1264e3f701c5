package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/periodic"
)

// PurgeIntervalDefault is how often a Purger purges.
const PurgeIntervalDefault = time.Hour

// PurgerConfig configures a Purger.
type PurgerConfig struct {
	// Markers configures the purge of processed_event markers and
	// delivery_attempt counts (Purge). Required: Horizon and ReplayWindow.
	Markers PurgeConfig
	// FailedHorizon, when positive, also deletes parked messages last failed
	// more than FailedHorizon ago (PurgeFailed, with Markers' consumer,
	// replay window and batch size). Zero keeps them until an operator
	// removes them.
	FailedHorizon time.Duration
	// Interval is how often the purges run, with 10% jitter. Defaults to 1h.
	Interval time.Duration
	// Logger receives a line per purge that deleted something, and errors.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// Purger runs Purge (and PurgeFailed) every Interval, as a long-running
// service with Start and Stop, so that processed_event stays small without a
// cron job.
type Purger[TTx any] struct {
	drv  driver.Driver[TTx]
	cfg  PurgerConfig
	log  *slog.Logger
	loop periodic.Loop

	// markerErrs and failedErrs log the failures of the two purges.
	markerErrs, failedErrs *errlog.Limiter
}

// NewPurger returns a purger of drv's tables. It checks the configuration
// as Purge would (a horizon under the replay window is refused).
func NewPurger[TTx any](drv driver.Driver[TTx], cfg PurgerConfig) (*Purger[TTx], error) {
	if err := cfg.Markers.Validate(); err != nil {
		return nil, err
	}
	if cfg.FailedHorizon < 0 {
		return nil, errors.New("idem: purger: FailedHorizon is negative")
	}
	if cfg.FailedHorizon > 0 {
		failed := cfg.Markers
		failed.Horizon = cfg.FailedHorizon
		if err := failed.Validate(); err != nil {
			return nil, fmt.Errorf("idem: purger: FailedHorizon: %w", err)
		}
	}
	if cfg.Interval < 0 {
		return nil, errors.New("idem: purger: Interval is negative")
	}
	if cfg.Interval == 0 {
		cfg.Interval = PurgeIntervalDefault
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	p := &Purger[TTx]{drv: drv, cfg: cfg, log: log.With("component", "purger", "consumer", cfg.Markers.Consumer)}
	p.markerErrs = errlog.New(p.log, "purge of processed_event", errlog.Config{})
	p.failedErrs = errlog.New(p.log, "purge of failed_message", errlog.Config{})
	p.loop = periodic.Loop{Interval: cfg.Interval, Jitter: 0.1, Run: p.RunOnce}
	return p, nil
}

// Start starts purging in the background, the first time one Interval from
// now. ctx is not used after Start returns: the purger runs until Stop. It
// returns an error wrapping idem.ErrStarted or idem.ErrStopped when the
// purger was started or stopped before.
func (p *Purger[TTx]) Start(ctx context.Context) error {
	if err := p.loop.Start(); err != nil {
		return fmt.Errorf("idem: purger: %w", err)
	}
	return nil
}

// RunOnce purges once, now, and logs what it did. A failure is logged
// (its repeats once per interval, see package errlog), and the next round
// tries again.
func (p *Purger[TTx]) RunOnce(ctx context.Context) {
	res, err := Purge(ctx, p.drv, p.cfg.Markers)
	if err != nil {
		if ctx.Err() == nil {
			p.markerErrs.Warn(ctx, "purge of processed_event failed", err)
		}
	} else {
		p.markerErrs.OK(ctx)
		if res.Deleted+res.Attempts > 0 {
			p.log.Info("processed_event purged", "deleted", res.Deleted, "attempts", res.Attempts, "before", res.Before)
		}
	}
	if p.cfg.FailedHorizon <= 0 {
		return
	}
	failed := p.cfg.Markers
	failed.Horizon = p.cfg.FailedHorizon
	res, err = PurgeFailed(ctx, p.drv, failed)
	if err != nil {
		if ctx.Err() == nil {
			p.failedErrs.Warn(ctx, "purge of failed_message failed", err)
		}
		return
	}
	p.failedErrs.OK(ctx)
	if res.Deleted > 0 {
		p.log.Info("failed_message purged", "deleted", res.Deleted, "before", res.Before)
	}
}

// Stop stops purging and returns once a purge in progress has finished.
// When ctx ends first, the purge is cancelled and Stop returns ctx's error
// at once; Done is closed once the purge has returned. Stop is idempotent
// and safe to call from several goroutines.
func (p *Purger[TTx]) Stop(ctx context.Context) error { return p.loop.Stop(ctx) }

// Done is closed when the purger has stopped.
func (p *Purger[TTx]) Done() <-chan struct{} { return p.loop.Done() }
