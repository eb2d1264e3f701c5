package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/driver"
)

// ErrHorizonTooShort is returned by Purge when the horizon is shorter than the
// replay window: markers younger than the window may still be needed to
// recognise a replayed or retried copy of their event.
var ErrHorizonTooShort = errors.New("idem: purge horizon shorter than the replay window")

// PurgeBatchSizeDefault is the default number of markers deleted per statement.
const PurgeBatchSizeDefault = 1000

// PurgeConfig configures Purge.
type PurgeConfig struct {
	// Consumer limits the purge to one consumer name. Empty purges every
	// consumer of the table.
	Consumer string
	// Horizon: markers processed more than Horizon ago are deleted. Required.
	Horizon time.Duration
	// ReplayWindow is how far back a copy of an event can still arrive: the
	// outbox retention (how far back producers can replay) plus the longest
	// stay of a message in a failure store or a retry queue. Purge refuses a
	// Horizon shorter than it. Required.
	ReplayWindow time.Duration
	// BatchSize is the number of markers deleted per statement, so a large
	// purge never holds long locks. Defaults to 1000.
	BatchSize int
	// Now is the current time. Defaults to time.Now.
	Now func() time.Time
}

func (c PurgeConfig) validate() error {
	switch {
	case c.ReplayWindow <= 0:
		return errors.New("idem: purge: ReplayWindow is required: how far back an event can be replayed or retried (outbox retention plus failure-store stay)")
	case c.Horizon <= 0:
		return errors.New("idem: purge: Horizon is required: markers older than it are deleted")
	case c.Horizon < c.ReplayWindow:
		return fmt.Errorf("%w: horizon %v < replay window %v; a replay of the last %v would apply events again. Use a horizon of at least %v",
			ErrHorizonTooShort, c.Horizon, c.ReplayWindow, c.ReplayWindow, c.ReplayWindow)
	case c.BatchSize < 0:
		return fmt.Errorf("idem: purge: BatchSize %d is negative", c.BatchSize)
	}
	return nil
}

// PurgeResult reports what Purge did.
type PurgeResult struct {
	Deleted int64
	Before  time.Time
	Batches int
}

// Purge deletes processed_event markers older than cfg.Horizon, in batches of
// cfg.BatchSize, after checking that the horizon is not shorter than the
// replay window (ErrHorizonTooShort). It stops early, with what it deleted so
// far, when ctx is done.
func Purge[TTx any](ctx context.Context, drv driver.Driver[TTx], cfg PurgeConfig) (PurgeResult, error) {
	if err := cfg.validate(); err != nil {
		return PurgeResult{}, err
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = PurgeBatchSizeDefault
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	res := PurgeResult{Before: now().Add(-cfg.Horizon)}
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		n, err := drv.Dialect().PurgeProcessed(ctx, drv.Pool(), cfg.Consumer, res.Before, cfg.BatchSize)
		if err != nil {
			return res, fmt.Errorf("idem: purge: %w", err)
		}
		res.Deleted += n
		res.Batches++
		if n < int64(cfg.BatchSize) {
			return res, nil
		}
	}
}
