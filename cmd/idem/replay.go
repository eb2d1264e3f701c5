package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"time"

	"github.com/idem-go/idem/relay"
)

// replayCommand is "idem replay".
func replayCommand() *command {
	return &command{
		name:    "replay",
		summary: "publish again the events of a period still in the outbox",
		usage: `Usage:
  idem replay --since T [--until T] [--event NAME] [--aggregate-type T] [--db URL] [--broker URL] [--yes]

Publishes again, with their original event ids, the events already published
whose occurred_at is in [--since, --until) and that are still in the outbox:
after an incident that lost messages at the broker or in a consumer. Events of
one aggregate are published in their original order. Consumers skip the events
they had already processed, as duplicates.

The outbox keeps published events for the relay's --retention: that is the
period a replay can cover. Consumers must keep processed_event markers at
least as long ("idem purge" refuses a shorter horizon than the replay window),
or a replay would apply events a second time.

It first prints how many events of each name would be published, then asks
for confirmation; --yes skips the question. Times are RFC 3339
(2026-12-02T08:00:00Z), dates (2026-12-02) or durations back from now (2h).

Examples:
  idem replay --since 2026-12-02T08:00:00Z --until 2026-12-02T09:00:00Z
  idem replay --since 6h --event order.order.placed.v1 --yes`,
		setup: setupReplay,
	}
}

// replayOptions holds the flags of "idem replay".
type replayOptions struct {
	db      dbFlags
	br      brokerFlags
	since   string
	until   string
	event   string
	aggType string
	yes     bool
	batch   int
}

// setupReplay declares the flags of "idem replay" on fs and returns the
// function that runs the command.
func setupReplay(fs *flag.FlagSet) runFunc {
	o := &replayOptions{}
	o.db.register(fs)
	o.br.register(fs)
	fs.StringVar(&o.since, "since", "", "start of the period (inclusive); required")
	fs.StringVar(&o.until, "until", "", "end of the period (exclusive; default now)")
	fs.StringVar(&o.event, "event", "", "replay only events with this name")
	fs.StringVar(&o.aggType, "aggregate-type", "", "replay only events of this aggregate type")
	fs.BoolVar(&o.yes, "yes", false, "do not ask for confirmation")
	fs.IntVar(&o.batch, "batch-size", relay.BatchSizeDefault, "rows read per query")
	return o.run
}

// run runs "idem replay" with the positional arguments args.
func (o *replayOptions) run(ctx context.Context, e *env, args []string) error {
	if len(args) != 0 {
		return usagef("unexpected arguments %q", args)
	}
	now := time.Now()
	if o.since == "" {
		return usagef("--since is required")
	}
	from, err := parseTime("since", o.since, now)
	if err != nil {
		return err
	}
	to := now
	if o.until != "" {
		if to, err = parseTime("until", o.until, now); err != nil {
			return err
		}
	}
	if !to.After(from) {
		return usagef("--until %s is not after --since %s", to.Format(time.RFC3339), from.Format(time.RFC3339))
	}
	if o.batch <= 0 {
		return usagef("--batch-size %d: want a positive number", o.batch)
	}
	f := relay.ReplayFilter{Since: from, Until: to, EventName: o.event, AggregateType: o.aggType}

	conn, err := o.db.open(ctx, e)
	if err != nil {
		return err
	}
	defer conn.Close()
	counts, err := relay.ReplayCounts(ctx, conn.SQL, f)
	if err != nil {
		return err
	}
	var total int64
	names := make([]string, 0, len(counts))
	for name, n := range counts {
		names = append(names, name)
		total += n
	}
	sort.Strings(names)
	fmt.Fprintf(e.stdout, "Published events with occurred_at in [%s, %s) still in the outbox:\n",
		from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339))
	if total == 0 {
		fmt.Fprintln(e.stdout, "  none. Nothing to replay.")
		return nil
	}
	width := len("total")
	for _, name := range names {
		width = max(width, len(name))
	}
	for _, name := range names {
		fmt.Fprintf(e.stdout, "  %-*s %d\n", width, name, counts[name])
	}
	fmt.Fprintf(e.stdout, "  %-*s %d\n", width, "total", total)

	pub, brokerURL, err := o.br.open(ctx, e)
	if err != nil {
		return err
	}
	defer pub.Close()
	if !o.yes && !confirm(e, fmt.Sprintf("Publish these %d events again to %s?", total, brokerURL)) {
		return fmt.Errorf("replay cancelled: nothing published")
	}
	n, err := relay.Replay(ctx, conn.SQL, pub, f, relay.ReplayOptions{BatchSize: o.batch})
	if err != nil {
		return fmt.Errorf("%d of %d events published: %w", n, total, err)
	}
	fmt.Fprintf(e.stdout, "Replayed %d events.\n", n)
	return nil
}
