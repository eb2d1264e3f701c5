package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/idem-go/idem/inbox"
)

func init() {
	register(&command{
		name:    "purge",
		summary: "delete old processed_event markers, never inside the replay window",
		usage: `Usage:
  idem purge --older-than DURATION --replay-window DURATION [--consumer NAME] [--db URL]

A marker can go once no copy of its event can arrive any more. That horizon
is the replay window: how far back producers can replay their outbox (the
relay's --retention) plus the longest stay of a message in a failure store.
Purge refuses an --older-than shorter than --replay-window: a replay of that
period would apply events a second time. Rows are deleted in batches.

Durations accept h, m, s and d (days): 720h, 30d.

Examples:
  idem purge --older-than 35d --replay-window 30d
  idem purge --consumer stock --older-than 60d --replay-window 45d --db postgres://localhost/stock`,
		setup: func(fs *flag.FlagSet) runFunc {
			var db dbFlags
			db.register(fs)
			consumer := fs.String("consumer", "", "purge only this consumer's markers (default: all consumers)")
			olderThan := fs.String("older-than", "", "delete markers processed longer ago than this (required)")
			window := fs.String("replay-window", "", "how far back an event can be replayed or retried (required; default $IDEM_REPLAY_WINDOW)")
			batch := fs.Int("batch-size", inbox.PurgeBatchSizeDefault, "rows deleted per statement")
			return func(ctx context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if *window == "" {
					*window = e.getenv("IDEM_REPLAY_WINDOW")
				}
				horizon, err := parseDays("older-than", *olderThan)
				if err != nil {
					return err
				}
				replay, err := parseDays("replay-window", *window)
				if err != nil {
					return err
				}
				conn, err := db.open(ctx, e)
				if err != nil {
					return err
				}
				defer conn.Close()
				start := time.Now()
				res, err := inbox.Purge(ctx, conn.SQL, inbox.PurgeConfig{
					Consumer: *consumer, Horizon: horizon, ReplayWindow: replay, BatchSize: *batch,
				})
				if err != nil {
					if res.Deleted > 0 {
						fmt.Fprintf(e.stdout, "Deleted %d marker(s) before stopping.\n", res.Deleted)
					}
					return err
				}
				who := "all consumers"
				if *consumer != "" {
					who = "consumer " + *consumer
				}
				fmt.Fprintf(e.stdout, "Deleted %d marker(s) of %s processed before %s in %d batch(es), %v.\n",
					res.Deleted, who, res.Before.UTC().Format(time.RFC3339), res.Batches, time.Since(start).Round(time.Millisecond))
				return nil
			}
		},
	})
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
