package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/progress"
)

// purgeCommand is "idem purge".
func purgeCommand() *command {
	return &command{
		name:    "purge",
		summary: "delete old processed_event markers and old parked messages, never inside the replay window",
		usage: `Usage:
  idem purge --older-than DURATION --replay-window DURATION [--consumer NAME] [--db URL]
  idem purge --failed-older-than DURATION --replay-window DURATION [--consumer NAME] [--db URL]

--older-than deletes processed_event markers processed longer ago than
DURATION, and the attempt counts of events (delivery_attempt) that last
failed longer ago than it. A marker can go once no copy of its event can
arrive any more. That horizon is the replay window: how far back producers
can replay their outbox (the relay's --retention) plus the longest stay of a
message in a failure store. Purge refuses an --older-than shorter than
--replay-window: a replay of that period would apply events a second time.

--failed-older-than deletes the messages of the failure store (failed_message)
that last failed longer ago than DURATION, for good: they can no longer be
shown or retried ("idem failed"). It is refused when shorter than
--replay-window too, since the window promises that a parked message can be
retried that long.

Give either or both. Rows are deleted in batches.

Durations accept h, m, s and d (days): 720h, 30d.

Examples:
  idem purge --older-than 35d --replay-window 30d
  idem purge --failed-older-than 90d --replay-window 30d
  idem purge --consumer stock --older-than 60d --failed-older-than 60d --replay-window 45d --db postgres://localhost/stock`,
		setup: setupPurge,
	}
}

// purgeOptions holds the flags of "idem purge".
type purgeOptions struct {
	db              dbFlags
	consumer        string
	olderThan       string
	failedOlderThan string
	window          string
	batch           int
}

// setupPurge declares the flags of "idem purge" on fs and returns the
// function that runs the command.
func setupPurge(fs *flag.FlagSet) runFunc {
	o := &purgeOptions{}
	o.db.register(fs)
	fs.StringVar(&o.consumer, "consumer", "", "purge only this consumer's rows (default: all consumers)")
	fs.StringVar(&o.olderThan, "older-than", "", "delete markers processed, and attempt counts last failed, longer ago than this")
	fs.StringVar(&o.failedOlderThan, "failed-older-than", "", "delete parked messages (failed_message) last failed longer ago than this")
	fs.StringVar(&o.window, "replay-window", "", "how far back an event can be replayed or retried (required; default $IDEM_REPLAY_WINDOW)")
	fs.IntVar(&o.batch, "batch-size", inbox.PurgeBatchSizeDefault, "rows deleted per statement")
	return o.run
}

// run runs "idem purge" with the positional arguments args.
func (o *purgeOptions) run(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	if o.olderThan == "" && o.failedOlderThan == "" {
		return usagef("give --older-than (markers), --failed-older-than (parked messages) or both")
	}
	if o.window == "" {
		o.window = e.getenv("IDEM_REPLAY_WINDOW")
	}
	var horizon, failedHorizon time.Duration
	var err error
	if o.olderThan != "" {
		if horizon, err = parseDays("older-than", o.olderThan); err != nil {
			return err
		}
	}
	if o.failedOlderThan != "" {
		if failedHorizon, err = parseDays("failed-older-than", o.failedOlderThan); err != nil {
			return err
		}
	}
	replay, err := parseDays("replay-window", o.window)
	if err != nil {
		return err
	}
	// Both horizons are checked before anything is deleted.
	for _, h := range []time.Duration{horizon, failedHorizon} {
		if h == 0 {
			continue
		}
		if err := (inbox.PurgeConfig{Horizon: h, ReplayWindow: replay, BatchSize: o.batch}).Validate(); err != nil {
			return err
		}
	}
	conn, err := o.db.open(ctx, e)
	if err != nil {
		return err
	}
	defer conn.Close()
	who := "all consumers"
	if o.consumer != "" {
		who = "consumer " + o.consumer
	}
	cfg := inbox.PurgeConfig{Consumer: o.consumer, ReplayWindow: replay, BatchSize: o.batch}
	if horizon > 0 {
		start := time.Now()
		cfg.Horizon = horizon
		rep, err := newProgress(e, "purge", "rows", 0)
		if err != nil {
			return err
		}
		defer rep.Finish()
		cfg.Progress = func(r inbox.PurgeResult) { rep.Set(r.Deleted + r.Attempts) }
		res, err := inbox.Purge(ctx, conn.SQL, cfg)
		rep.Finish(progress.Count{Name: "markers", N: res.Deleted}, progress.Count{Name: "attempt counts", N: res.Attempts})
		if err != nil {
			if res.Deleted > 0 || res.Attempts > 0 {
				fmt.Fprintf(e.stdout, "Deleted %d marker(s) and %d attempt count(s) before stopping.\n", res.Deleted, res.Attempts)
			}
			return err
		}
		fmt.Fprintf(e.stdout, "Deleted %d marker(s) of %s processed before %s in %d batch(es), and %d attempt count(s), %v.\n",
			res.Deleted, who, res.Before.UTC().Format(time.RFC3339), res.Batches, res.Attempts, time.Since(start).Round(time.Millisecond))
	}
	if failedHorizon > 0 {
		start := time.Now()
		cfg.Horizon = failedHorizon
		rep, err := newProgress(e, "purge", "parked messages", 0)
		if err != nil {
			return err
		}
		defer rep.Finish()
		cfg.Progress = func(r inbox.PurgeResult) { rep.Set(r.Deleted) }
		res, err := inbox.PurgeFailed(ctx, conn.SQL, cfg)
		rep.Finish()
		if err != nil {
			if res.Deleted > 0 {
				fmt.Fprintf(e.stdout, "Deleted %d parked message(s) before stopping.\n", res.Deleted)
			}
			return err
		}
		fmt.Fprintf(e.stdout, "Deleted %d parked message(s) of %s last failed before %s in %d batch(es), %v.\n",
			res.Deleted, who, res.Before.UTC().Format(time.RFC3339), res.Batches, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// parseDays parses a Go duration that may also use d for days ("30d").
func parseDays(flagName, s string) (time.Duration, error) {
	if s == "" {
		return 0, usagef("--%s is required", flagName)
	}
	var days float64
	if n, err := fmt.Sscanf(s, "%gd", &days); err == nil && n == 1 && fmt.Sprintf("%gd", days) == s {
		return time.Duration(days * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, usagef("--%s %q: want a positive duration such as 720h or 30d", flagName, s)
	}
	return d, nil
}
