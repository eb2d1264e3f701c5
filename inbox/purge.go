package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/driver"
)

// ErrHorizonTooShort is returned by Purge and PurgeFailed when the horizon
// is shorter than the replay window: markers younger than the window may
// still be needed to recognise a replayed or retried copy of their event,
// and the window promises that a parked message can be retried that long.
var ErrHorizonTooShort = errors.New("idem: purge horizon shorter than the replay window")

// PurgeBatchSizeDefault is the default number of rows deleted per statement.
const PurgeBatchSizeDefault = 1000

// PurgeConfig configures Purge and PurgeFailed.
type PurgeConfig struct {
	// Consumer limits the purge to one consumer name. Empty purges every
	// consumer of the table.
	Consumer string
	// Horizon: rows older than Horizon are deleted (markers processed,
	// attempt counts and parked messages last failed, more than Horizon
	// ago). Required.
	Horizon time.Duration
	// ReplayWindow is how far back a copy of an event can still arrive: the
	// outbox retention (how far back producers can replay) plus the longest
	// stay of a message in a failure store or a retry queue. Purges refuse a
	// Horizon shorter than it. Required.
	ReplayWindow time.Duration
	// BatchSize is the number of rows deleted per statement, so a large
	// purge never holds long locks. Defaults to 1000.
	BatchSize int
	// Now is the current time. Defaults to time.Now.
	Now func() time.Time
	// Progress, when set, is called by Purge and PurgeFailed after each
	// statement with what they deleted so far (a purge's rows have no
	// total: it deletes until a batch comes back short).
	Progress func(PurgeResult)
}

// Validate reports what is wrong with c, as Purge and PurgeFailed do before
// deleting anything: a missing ReplayWindow or Horizon, a Horizon shorter
// than the ReplayWindow (ErrHorizonTooShort), a negative BatchSize.
func (c PurgeConfig) Validate() error {
	switch {
	case c.ReplayWindow <= 0:
		return errors.New("idem: purge: ReplayWindow is required: how far back an event can be replayed or retried (outbox retention plus failure-store stay)")
	case c.Horizon <= 0:
		return errors.New("idem: purge: Horizon is required: rows older than it are deleted")
	case c.Horizon < c.ReplayWindow:
		return fmt.Errorf("%w: horizon %v < replay window %v; a replay or retry of the last %v would apply events again or find them gone. Use a horizon of at least %v",
			ErrHorizonTooShort, c.Horizon, c.ReplayWindow, c.ReplayWindow, c.ReplayWindow)
	case c.BatchSize < 0:
		return fmt.Errorf("idem: purge: BatchSize %d is negative", c.BatchSize)
	}
	return nil
}

// PurgeResult reports what Purge or PurgeFailed did.
type PurgeResult struct {
	// Deleted is the number of markers (Purge) or parked messages
	// (PurgeFailed) deleted.
	Deleted int64
	// Attempts is the number of delivery_attempt rows Purge deleted.
	Attempts int64
	// Before is the horizon: rows older than it were deleted.
	Before time.Time
	// Batches is the number of statements that deleted Deleted.
	Batches int
}

// Purge deletes processed_event markers older than cfg.Horizon, then the
// delivery_attempt counts whose last failure is older than it, in batches
// of cfg.BatchSize, after checking that the horizon is not shorter than the
// replay window (ErrHorizonTooShort). It stops early, with what it deleted
// so far, when ctx is done.
func Purge[TTx any](ctx context.Context, drv driver.Driver[TTx], cfg PurgeConfig) (PurgeResult, error) {
	res, cfg, err := startPurge(cfg)
	if err != nil {
		return res, err
	}
	d := drv.Dialect()
	err = purgeBatches(ctx, cfg, &res, &res.Deleted, &res.Batches, func(limit int) (int64, error) {
		return d.PurgeProcessed(ctx, drv.Pool(), cfg.Consumer, res.Before, limit)
	})
	if err != nil {
		return res, fmt.Errorf("idem: purge: %w", err)
	}
	err = purgeBatches(ctx, cfg, &res, &res.Attempts, new(int), func(limit int) (int64, error) {
		return d.PurgeAttempts(ctx, drv.Pool(), cfg.Consumer, res.Before, limit)
	})
	if err != nil {
		return res, fmt.Errorf("idem: purge attempt counts: %w", err)
	}
	return res, nil
}

// PurgeFailed deletes the messages of the failure store (failed_message)
// whose last failure is older than cfg.Horizon, in batches of
// cfg.BatchSize. It refuses a horizon shorter than the replay window
// (ErrHorizonTooShort), which promises that a parked message can be retried
// that long. It stops early, with what it deleted so far, when ctx is done.
func PurgeFailed[TTx any](ctx context.Context, drv driver.Driver[TTx], cfg PurgeConfig) (PurgeResult, error) {
	res, cfg, err := startPurge(cfg)
	if err != nil {
		return res, err
	}
	err = purgeBatches(ctx, cfg, &res, &res.Deleted, &res.Batches, func(limit int) (int64, error) {
		return drv.Dialect().PurgeFailed(ctx, drv.Pool(), cfg.Consumer, res.Before, limit)
	})
	if err != nil {
		return res, fmt.Errorf("idem: purge failed messages: %w", err)
	}
	return res, nil
}

// startPurge validates cfg, applies its defaults and computes the horizon.
func startPurge(cfg PurgeConfig) (PurgeResult, PurgeConfig, error) {
	if err := cfg.Validate(); err != nil {
		return PurgeResult{}, cfg, err
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = PurgeBatchSizeDefault
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	return PurgeResult{Before: now().Add(-cfg.Horizon)}, cfg, nil
}

// purgeBatches calls del until it deletes fewer than a batch, adding the
// rows deleted to *deleted and the calls to *batches, and telling
// cfg.Progress what res holds after each.
func purgeBatches(ctx context.Context, cfg PurgeConfig, res *PurgeResult, deleted *int64, batches *int, del func(limit int) (int64, error)) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := del(cfg.BatchSize)
		if err != nil {
			return err
		}
		*deleted += n
		*batches++
		if cfg.Progress != nil {
			cfg.Progress(*res)
		}
		if n < int64(cfg.BatchSize) {
			return nil
		}
	}
}
