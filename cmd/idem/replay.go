package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"time"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/relay"
)

// replayCommand is "idem replay".
func replayCommand() *command {
	return &command{
		name:    "replay",
		summary: "publish again the events of a period the relay kept (outbox or archive)",
		usage: `Usage:
  idem replay --since T [--until T] [--event NAME] [--aggregate-type T] [--db URL] [--broker URL] [--yes]
              [--to-consumer C [--prefix P]]

Publishes again, with their original event ids, the events already published
whose occurred_at is in [--since, --until): after an incident that lost
messages at the broker or in a consumer. Events of one aggregate are
published in their original order. Consumers skip the events they had
already processed, as duplicates.

A replay covers what the relay of the outbox keeps:

  idem relay   (the polling relay) the published rows, in the outbox, for
               its --retention (7 days by default), then deleted.
  idem cdc     (PostgreSQL's WAL, MariaDB's binlog) no published row: it
               deletes its rows (or leaves them unmarked, --keep-rows), and
               a WAL message is no row at all. It keeps the events it
               published, rows and WAL messages, in the archive
               outbox_archive (migration 0013) for its
               --archive-retention (7 days by default), then deletes them;
               with --archive-retention 0 it keeps nothing, and nothing it
               published can be replayed.

The replay reads both, the outbox's published rows and the archived events
(an event in both is published once). When a relay replaced the other
during the period, the events of the one that ran first are published
first, so that each aggregate's keep their order across the move. When the period holds nothing, or starts before the
archive's oldest event, it says what the archive holds. Consumers must keep
processed_event markers at least as long as that retention ("idem purge"
refuses a shorter horizon than the replay window), or a replay would apply
events a second time.

--to-consumer C publishes them to consumer C only instead of every service
bound to them: a consumer that lost messages, or was fixed, gets them again
without re-driving the others (RabbitMQ: C's queue, <prefix>.<C>.events, or
its partition exchange; NATS: C's durable consumer, on each message's
partition). On Kafka, whose consumer groups share topics, it rewinds C's
group instead: each partition's offset goes back to the first record
produced at or after --since (never forward), so that C reads every record
from then on again (--until, --event and --aggregate-type do not apply).
Stop C's subscribers first: Kafka refuses a group's offsets from outside
while it has members. The replayed events come after what
already waits in C's queue: an aggregate's replayed events keep their order
among themselves, not with the later events C receives meanwhile (see
docs/OPERATIONS.md, "Replaying a period").

It first prints how many events of each name would be published, then asks
for confirmation; --yes skips the question. Times are RFC 3339
(2026-12-02T08:00:00Z), dates (2026-12-02) or durations back from now (2h).

Examples:
  idem replay --since 2026-12-02T08:00:00Z --until 2026-12-02T09:00:00Z
  idem replay --since 6h --event order.order.placed.v1 --yes
  idem replay --since 24h --to-consumer billing`,
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
	// toConsumer and prefix: replay to that consumer only, through cp
	// (openConsumer), which closeConsumer closes.
	toConsumer    string
	prefix        string
	untilGiven    bool
	cp            broker.ConsumerPublisher
	closeConsumer func()
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
	fs.StringVar(&o.toConsumer, "to-consumer", "", "publish to this consumer only (RabbitMQ, NATS), not to every service bound to the events; on Kafka, rewind its group to --since")
	fs.StringVar(&o.prefix, "prefix", "", "with --to-consumer: prefix of the broker's names, as the consumers subscribed with")
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
	o.untilGiven = o.until != ""
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
	if o.prefix != "" && o.toConsumer == "" {
		return usagef("--prefix goes with --to-consumer")
	}
	f := relay.ReplayFilter{Since: from, Until: to, EventName: o.event, AggregateType: o.aggType}
	if o.toConsumer != "" {
		done, err := o.openConsumer(ctx, e, from)
		if done || err != nil {
			return err
		}
		defer o.closeConsumer()
	}

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
	fmt.Fprintf(e.stdout, "Published events with occurred_at in [%s, %s) kept by the relay (outbox and archive):\n",
		from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339))
	if total == 0 {
		fmt.Fprintln(e.stdout, "  none. Nothing to replay.")
	}
	if err := explainArchive(ctx, e, conn, from, total == 0); err != nil {
		return err
	}
	if total == 0 {
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

	pub, brokerURL, closePub, err := o.open(ctx, e)
	if err != nil {
		return err
	}
	defer closePub()
	if o.toConsumer != "" {
		brokerURL = fmt.Sprintf("consumer %s only, at %s", o.toConsumer, brokerURL)
	}
	if !o.yes && !confirm(e, fmt.Sprintf("Publish these %d events again to %s?", total, brokerURL)) {
		return fmt.Errorf("replay cancelled: nothing published")
	}
	rep, err := newProgress(e, "replay", "events", total)
	if err != nil {
		return err
	}
	defer rep.Finish()
	n, err := relay.Replay(ctx, conn.SQL, pub, f, relay.ReplayOptions{BatchSize: o.batch, Progress: rep.Set})
	rep.Set(n)
	if err != nil {
		return fmt.Errorf("%d of %d events published: %w", n, total, err)
	}
	rep.Finish()
	fmt.Fprintf(e.stdout, "Replayed %d events.\n", n)
	return nil
}

// open opens the broker the replay publishes to: every bound queue, or
// with --to-consumer that consumer's only. It returns the publisher, the
// broker's URL without its password, and the function that closes it.
func (o *replayOptions) open(ctx context.Context, e *env) (broker.Publisher, string, func(), error) {
	if o.toConsumer == "" {
		pub, u, err := o.br.open(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		return pub, u, func() { _ = pub.Close() }, nil
	}
	return broker.ToConsumer(o.cp, o.toConsumer), broker.RedactURL(o.br.Resolve(e.getenv)), func() {}, nil
}

// explainArchive tells, under the counts of a replay, what the outbox's
// archive holds when the period may hold events the relays did not keep:
// always when nothing was found (empty), otherwise when the period starts
// before the archive's oldest event.
func explainArchive(ctx context.Context, e *env, conn *registry.Database, from time.Time, empty bool) error {
	info, ok, err := relay.Archive(ctx, conn.SQL)
	if err != nil {
		return err
	}
	const keeps = "idem relay keeps published rows in the outbox for its --retention; idem cdc keeps the events it publishes in the archive for its --archive-retention (7 days by default; 0 keeps nothing)"
	switch {
	case !ok:
		if empty {
			fmt.Fprintf(e.stdout, "  This database keeps the published rows the polling relay has not deleted yet (its --retention): the period holds none.\n")
		}
	case !info.Exists:
		if empty {
			fmt.Fprintf(e.stdout, "  This database has no archive (table %s, migration 0013): the events idem cdc published are not kept.\n  Run idem migrate, and idem cdc keeps what it publishes from then on (--archive-retention, 7 days by default).\n  (%s.)\n",
				conn.SQL.Dialect().Tables().OutboxArchive, keeps)
		}
	case info.Empty:
		if empty {
			fmt.Fprintf(e.stdout, "  The archive (%s) is empty: idem cdc runs with --archive-retention 0 (no archive), or published nothing within its retention.\n  Start it without --archive-retention 0 (or with --archive-retention 168h) to keep what it publishes from then on.\n  (%s.)\n",
				conn.SQL.Dialect().Tables().OutboxArchive, keeps)
		}
	case from.Before(info.OldestOccurred):
		fmt.Fprintf(e.stdout, "  The period starts before the archive's oldest event (occurred at %s; the oldest was archived at %s):\n  events published by idem cdc before then are beyond its --archive-retention (deleted), or were published before the archive was on.\n  (%s.)\n",
			info.OldestOccurred.UTC().Format(time.RFC3339), info.OldestPublished.UTC().Format(time.RFC3339), keeps)
	}
	return nil
}
