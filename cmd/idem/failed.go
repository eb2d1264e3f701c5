package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/webhookin"
	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/progress"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/internal/textshow"
)

// failedCommand is "idem failed".
func failedCommand() *command {
	return &command{
		name:    "failed",
		summary: "list, group, show, edit, retry, archive or remove messages in a consumer's failure store",
		usage: `Usage:
  idem failed list    [--db URL] [--consumer C] [--event NAME] [--since T] [--held-by ID] [--limit N] [--archived]
  idem failed groups  [--db URL] [filters] [--archived] [--json]
  idem failed show    [--db URL] ID
  idem failed edit    [--db URL] [--by NAME] ID [--body-file FILE] [--header NAME=VALUE]... [--drop-header NAME]...
  idem failed retry   [--db URL] [--broker URL] [--by NAME] ID... | --all [filters] | --group GROUP [--yes] [filters]
  idem failed retry   [--db URL] [--broker URL] [--by NAME] --to-consumer C [--prefix P] ID...
  idem failed archive [--db URL] [--by NAME] ID... | --all [filters] | --group GROUP [--yes] [filters]
  idem failed remove  [--db URL] [--by NAME] [--yes] ID... | --all [filters] | --group GROUP [filters] [--archived]

  filters: [--consumer C] [--event NAME] [--since T] [--held-by ID]

The failure store (table failed_message of a consumer's database) keeps the
messages a consumer could not decode, or that failed on every attempt or with
a permanent error, exactly as they were received: body, headers, the queue
they came from, the error history and the attempt count.

A parked message holds its aggregate: the later messages of that aggregate
that reach the consumer are parked behind it ("held by" its ID), so that an
aggregate's events are never applied out of order. --held-by ID selects them.

list shows the newest messages first, --limit of them (0: all).

groups sorts the messages into groups by consumer and cause, largest group
first: the cause is the class of the failure (undecodable: the message could
not be decoded; permanent: the handler returned idem.Permanent; exhausted:
the handler failed on every attempt; held: the message waits behind a parked
message of its aggregate) and the error text with its variable parts
(UUIDs, numbers, quoted values, hex, times) replaced by <uuid>, <n>, <q>,
<hex>, <time>, so that messages that failed alike fall in one group. Each
group has a GROUP id (12 hex digits, the same from one run to the next) and
shows its count and the first and last failure. --json prints the groups as
a JSON array, for scripts. retry --group GROUP and remove --group GROUP act
on every message of the group (among those the filters select) after one
confirmation (--yes skips it), and say what they did.

retry publishes each stored message again, unchanged (same body, same event
id, its headers plus idem-redrive with its ID), to the queue it was received
from only. The consumer removes it from the store once it is applied (or
found applied already: the consumer deduplicates on the event id); if it
fails again it is parked again, in the same entry. Its attempt count starts
again at 1. Fix the handler first. Retrying a message also retries the
messages held behind it, after it. With --all it goes through every
matching message, oldest first, so that the messages of one aggregate go
back in the order they were parked; messages parked while it runs (a retried
message failing again) wait for the next run. A message that a webhook
handler parked (source webhook:...) goes back through that handler, in the
application that received it (inbox/webhookin): retry reports it, not
retried.

With --group it goes through the group's messages, oldest first, each
followed by the messages held behind it, as retrying it by ID does.

remove deletes stored messages; it asks for confirmation unless --yes. With
--all it goes through every matching message, with --group through the
group's messages. Removing a message releases its aggregate: the messages
held behind it stay in the store, to retry or remove (--held-by ID).

--since takes an RFC 3339 time, a date, or a duration back from now (2h).

Examples:
  idem failed list --consumer stock --since 24h
  idem failed groups --consumer stock
  IDEM_BROKER_URL=amqp://... idem failed retry --group 3fa2c1d9e0b7
  idem failed show 42
  idem failed retry 42 --broker-file /run/secrets/broker-url
  idem failed remove --all --event order.order.placed.v0 --yes
  idem failed edit 42 --body-file fixed.json --by alice
  idem failed retry 42 --to-consumer billing --by alice
  idem failed archive --group 3fa2c1d9e0b7 --yes` + failedOpsUsage + quarantineUsage,
		setup: setupFailed,
	}
}

// failedOptions holds the flags of "idem failed".
type failedOptions struct {
	db         dbFlags
	quarantine *quarantineFlags
	brokerURL  string
	consumer   string
	event      string
	since      string
	limit      int
	all        bool
	yes        bool
	heldBy     int64
	group      string
	asJSON     bool
	ops        failedOpsFlags
}

// setupFailed declares the flags of "idem failed" on fs and returns the
// function that runs the command.
func setupFailed(fs *flag.FlagSet) runFunc {
	o := &failedOptions{}
	o.db.register(fs)
	o.quarantine = registerQuarantineFlags(fs, &o.db)
	fs.StringVar(&o.brokerURL, "broker", "", "with retry: broker URL (default $IDEM_BROKER_URL):\n"+registry.BrokerURLHelp())
	envflag.FileFlag(fs, "broker")
	fs.StringVar(&o.consumer, "consumer", "", "only messages of this consumer name")
	fs.StringVar(&o.event, "event", "", "only messages of this event name")
	fs.StringVar(&o.since, "since", "", "only messages failed since this time or duration back (24h)")
	fs.IntVar(&o.limit, "limit", 100, "with list: the most messages to list (0: all)")
	fs.BoolVar(&o.all, "all", false, "with retry or remove: every message matching the filters instead of IDs")
	fs.BoolVar(&o.yes, "yes", false, "with remove, or with --group: do not ask for confirmation")
	fs.StringVar(&o.group, "group", "", "with retry or remove: every message of this group (see \"idem failed groups\") instead of IDs")
	fs.BoolVar(&o.asJSON, "json", false, "with groups: print the groups as JSON")
	fs.Int64Var(&o.heldBy, "held-by", 0, "only messages parked behind this message ID (held by it)")
	o.ops.register(fs)
	return o.run
}

// run runs "idem failed" with the positional arguments args.
func (o *failedOptions) run(ctx context.Context, e *env, args []string) error {
	if o.quarantine.relay {
		if o.ops.any() {
			return usagef("--by, --to-consumer, --prefix, --body-file, --header, --drop-header, --archived and --failure-events go with the failure store, not --relay")
		}
		return o.quarantine.run(ctx, e, args)
	}
	if len(args) == 0 {
		return usagef("want one of list, groups, show, edit, retry, archive, remove")
	}
	action, rest := args[0], args[1:]
	if err := checkGroupFlags(action, rest, o.group, o.all, o.asJSON); err != nil {
		return err
	}
	if err := o.ops.check(action, o.all, o.group); err != nil {
		return err
	}
	sinceT, err := parseTime("since", o.since, time.Now())
	if err != nil {
		return err
	}
	if o.heldBy < 0 {
		return usagef("--held-by %d: want a message ID", o.heldBy)
	}
	filter := idemmsg.FailedFilter{Consumer: o.consumer, EventName: o.event, Since: sinceT, HeldBy: o.heldBy, Archived: o.ops.archived}
	var ids []int64
	switch action {
	case "list":
		if len(rest) != 0 {
			return usagef("list takes no arguments")
		}
		if o.limit < 0 {
			return usagef("--limit %d: want 0 (all) or more", o.limit)
		}
		filter.Limit = o.limit
	case "groups":
		if len(rest) != 0 {
			return usagef("groups takes no arguments")
		}
	case "show", "edit":
		if len(rest) != 1 || o.all {
			return usagef("%s takes one message ID", action)
		}
	case "retry", "remove", "archive":
		if o.all && len(rest) > 0 {
			return usagef("give message IDs or --all, not both")
		}
		if !o.all && o.group == "" && len(rest) == 0 {
			return usagef("%s needs message IDs (see \"idem failed list\"), --group GROUP (see \"idem failed groups\") or --all", action)
		}
	default:
		return usagef("unknown action %q: want list, groups, show, edit, retry, archive or remove", action)
	}
	if action != "list" && action != "groups" {
		for _, a := range rest {
			id, err := strconv.ParseInt(a, 10, 64)
			if err != nil || id <= 0 {
				return usagef("message ID %q: want a positive integer", a)
			}
			ids = append(ids, id)
		}
	}

	conn, err := o.db.open(ctx, e)
	if err != nil {
		return err
	}
	defer conn.Close()
	store := o.ops.store(e, conn, inbox.NewFailureStore(conn.SQL))

	switch {
	case action == "list":
		return listFailed(ctx, e.stdout, store, filter)
	case action == "groups":
		return listGroups(ctx, e.stdout, store, filter, o.asJSON)
	case o.group != "":
		return groupFailed(ctx, e, store, filter, action, o.group, o.yes, o.brokerURL)
	case o.all:
		return allFailed(ctx, e, store, filter, action, o.yes, o.brokerURL)
	}
	var msgs []idemmsg.FailedMessage
	for _, id := range ids {
		m, err := store.Get(ctx, id)
		if errors.Is(err, idemmsg.ErrNotFound) {
			return fmt.Errorf("no failed message with ID %d", id)
		}
		if err != nil {
			return err
		}
		msgs = append(msgs, m)
	}
	switch action {
	case "show":
		printFailed(e.stdout, msgs[0])
		return nil
	case "edit":
		return o.ops.edit(ctx, e, store, msgs[0])
	case "archive":
		return archiveFailed(ctx, e, store, msgs)
	case "retry":
		if o.ops.toConsumer != "" {
			return redirectFailed(ctx, e, store, o.brokerURL, o.ops.prefix, o.ops.toConsumer, msgs)
		}
	case "remove":
		if !o.yes && !confirm(e, fmt.Sprintf("Remove %d failed message(s) for good?", len(msgs))) {
			return errors.New("not confirmed; nothing removed (pass --yes to skip the question)")
		}
		for _, m := range msgs {
			if err := removeFailed(ctx, e, store, m); err != nil {
				return err
			}
		}
		return nil
	}
	// A message a webhook handler parked goes back through that handler,
	// in its application: no broker can take it there.
	var done, failed int
	viaBroker := msgs[:0]
	for _, m := range msgs {
		if fromWebhook(m.Source) {
			reportRetry(e, m, errFromWebhook)
			failed++
			continue
		}
		viaBroker = append(viaBroker, m)
	}
	if len(viaBroker) == 0 {
		return fmt.Errorf("%d of %d message(s) not retried", failed, failed)
	}
	rd, closePub, err := openRedeliverer(ctx, e, o.brokerURL)
	if err != nil {
		return err
	}
	defer closePub()
	for _, m := range viaBroker {
		// The message, then the messages held behind it, in the
		// order they were parked.
		sent, notSent, err := store.Retry(ctx, rd, m, func(m idemmsg.FailedMessage, err error) { reportRetry(e, m, err) })
		done, failed = done+sent, failed+notSent
		if err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d message(s) not retried", failed, done+failed)
	}
	return nil
}

// listFailed prints the messages matching filter, newest first; filter.Limit
// 0 lists them all, read a page at a time.
func listFailed(ctx context.Context, w io.Writer, store *inbox.FailureStore, filter idemmsg.FailedFilter) error {
	var rows []failedRow
	add := func(page []idemmsg.FailedMessage) error {
		for _, m := range page {
			rows = append(rows, newFailedRow(m))
		}
		return nil
	}
	if filter.Limit > 0 {
		page, err := store.List(ctx, filter)
		if err != nil {
			return err
		}
		_ = add(page)
	} else if err := store.Pages(ctx, filter, add); err != nil {
		return err
	}
	printFailedList(w, rows)
	return nil
}

// allFailed retries or removes every message matching filter, oldest first
// (so that one aggregate's messages go back in order), a page at a time.
// Only the messages stored when it starts are concerned: a retried message
// that fails again, or a new one, waits for the next run.
func allFailed(ctx context.Context, e *env, store *inbox.FailureStore, filter idemmsg.FailedFilter, action string, yes bool, brokerURL string) error {
	first := filter
	first.Oldest, first.Limit = true, inbox.FailedPageSizeDefault
	page, err := store.List(ctx, first)
	if err != nil {
		return err
	}
	if len(page) == 0 {
		fmt.Fprintln(e.stdout, "No failed message matches.")
		return nil
	}
	if action == "remove" && !yes {
		question := fmt.Sprintf("Remove %d failed message(s) for good?", len(page))
		if len(page) == first.Limit {
			question = fmt.Sprintf("Remove every failed message matching the filters (more than %d) for good?", len(page)-1)
		}
		if !confirm(e, question) {
			return errors.New("not confirmed; nothing removed (pass --yes to skip the question)")
		}
	}
	if action == "remove" {
		n, err := store.RemoveGroup(ctx, filter, "", func(m idemmsg.FailedMessage) { reportRemoved(ctx, e, store, m) })
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "Removed %d failed message(s).\n", n)
		return nil
	}
	if action == "archive" {
		n, err := store.ArchiveGroup(ctx, filter, "", func(m idemmsg.FailedMessage) { reportArchived(ctx, e, store, m) })
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "Archived %d failed message(s).\n", n)
		return nil
	}
	rd, closePub, err := openRedeliverer(ctx, e, brokerURL)
	if err != nil {
		return err
	}
	defer closePub()
	total, err := store.Count(ctx, filter)
	if err != nil {
		return err
	}
	rep, err := newProgress(e, "failed retry", "messages", total)
	if err != nil {
		return err
	}
	defer rep.Finish()
	pe := withProgress(e, rep)
	_, done, failed, err := store.RetryGroup(ctx, rd, filter, "", func(m idemmsg.FailedMessage, _ bool, err error) {
		reportRetry(pe, m, err)
		rep.Add(1)
	})
	rep.Finish(progress.Count{Name: "not retried", N: int64(failed)})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "Retried %d failed message(s).\n", done)
	if failed > 0 {
		return fmt.Errorf("%d of %d message(s) not retried", failed, done+failed)
	}
	return nil
}

// openRedeliverer opens the broker at brokerURL (default $IDEM_BROKER_URL),
// which must be able to send a message back to one queue.
func openRedeliverer(ctx context.Context, e *env, brokerURL string) (broker.Redeliverer, func(), error) {
	rd, closePub, err := openBrokerAs[broker.Redeliverer](ctx, e, brokerURL, "",
		"cannot re-drive a message to the one consumer it came from (its publisher is not a broker.Redeliverer); republish the message with your broker's tools, or use a transport that can")
	if err != nil {
		return nil, nil, err
	}
	return brokerSources{rd}, closePub, nil
}

// errFromWebhook says why a message a webhook handler parked is not
// re-driven through a broker.
var errFromWebhook = errors.New("it came from a webhook handler (inbox/webhookin), which re-drives it in the application that received it " +
	"(inbox.FailureStore.Retry with the handler, or a dashboard mounted there with the handler as its Redeliverer); not retried")

// fromWebhook reports whether a parked message's source is a webhook
// handler's (webhookin.SourcePrefix) rather than a broker's queue.
func fromWebhook(source string) bool { return strings.HasPrefix(source, webhookin.SourcePrefix) }

// brokerSources is a broker's Redeliverer that refuses the messages of
// webhook handlers, which would otherwise go to a queue of that name.
type brokerSources struct{ broker.Redeliverer }

// Redeliver implements broker.Redeliverer.
func (b brokerSources) Redeliver(ctx context.Context, source string, msgs []idemmsg.Message) error {
	if fromWebhook(source) {
		return errFromWebhook
	}
	return b.Redeliverer.Redeliver(ctx, source, msgs)
}

// reportRetry says what became of the re-drive of m.
func reportRetry(e *env, m idemmsg.FailedMessage, err error) {
	switch {
	case errors.Is(err, inbox.ErrUnknownSource):
		fmt.Fprintf(e.stderr, "idem failed retry: %d: the queue it came from is unknown; not retried\n", m.ID)
	case err != nil:
		fmt.Fprintf(e.stderr, "idem failed retry: %d: %v\n", m.ID, err)
	default:
		fmt.Fprintf(e.stdout, "Retried %d (%s %s) to %s\n", m.ID, textshow.Printable([]byte(m.EventName)), m.EventID, textshow.Printable([]byte(m.Source)))
	}
}

func removeFailed(ctx context.Context, e *env, store *inbox.FailureStore, m idemmsg.FailedMessage) error {
	if _, err := store.Remove(ctx, m.ID); err != nil {
		return err
	}
	reportRemoved(ctx, e, store, m)
	return nil
}

// reportRemoved says that m was removed, and how to find the messages held
// behind it.
func reportRemoved(ctx context.Context, e *env, store *inbox.FailureStore, m idemmsg.FailedMessage) {
	fmt.Fprintf(e.stdout, "Removed %d (%s %s)\n", m.ID, textshow.Printable([]byte(m.EventName)), m.EventID)
	reportHeld(ctx, e, store, m)
}

// reportHeld says how to find the messages held behind m, if any, which
// stay in the store once m is gone or archived.
func reportHeld(ctx context.Context, e *env, store *inbox.FailureStore, m idemmsg.FailedMessage) {
	if held, err := store.List(ctx, idemmsg.FailedFilter{HeldBy: m.ID, Limit: 1}); err == nil && len(held) > 0 {
		fmt.Fprintf(e.stdout, "  messages held behind %d stay in the store: idem failed list --held-by %d\n", m.ID, m.ID)
	}
}

// failedRow is what the list shows of a message.
type failedRow struct {
	id       int64
	consumer string
	event    string
	eventID  string
	attempts int
	failedAt time.Time
	err      string
}

func newFailedRow(m idemmsg.FailedMessage) failedRow {
	return failedRow{id: m.ID, consumer: textshow.Printable([]byte(m.Consumer)), event: orDash(textshow.Printable([]byte(m.EventName))),
		eventID: eventIDText(m), attempts: m.Attempts, failedAt: m.LastFailed, err: textshow.OneLine(textshow.Printable([]byte(m.Error)), 100)}
}

func printFailedList(w io.Writer, rows []failedRow) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "No failed message matches.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONSUMER\tEVENT\tEVENT ID\tATTEMPTS\tFAILED AT\tERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.id, r.consumer, r.event, r.eventID,
			r.attempts, r.failedAt.UTC().Format(time.RFC3339), r.err)
	}
	_ = tw.Flush()
}

func printFailed(w io.Writer, m idemmsg.FailedMessage) {
	text := func(s string) string { return textshow.Printable([]byte(s)) }
	fmt.Fprintf(w, "ID:            %d\n", m.ID)
	fmt.Fprintf(w, "Consumer:      %s\n", text(m.Consumer))
	fmt.Fprintf(w, "Source:        %s\n", orDash(text(m.Source)))
	fmt.Fprintf(w, "Event:         %s\n", orDash(text(m.EventName)))
	fmt.Fprintf(w, "Event ID:      %s\n", eventIDText(m))
	if m.AggregateType != "" || m.AggregateID != "" {
		fmt.Fprintf(w, "Aggregate:     %s %s\n", text(m.AggregateType), text(m.AggregateID))
	}
	if m.HeldBy != 0 {
		fmt.Fprintf(w, "Held by:       %d (waits behind that message of its aggregate)\n", m.HeldBy)
	}
	if len(m.Key) > 0 {
		fmt.Fprintf(w, "Key:           %s\n", textshow.Printable(m.Key))
	}
	fmt.Fprintf(w, "Attempts:      %d\n", m.Attempts)
	fmt.Fprintf(w, "First failed:  %s\n", m.FirstFailed.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "Last failed:   %s\n", m.LastFailed.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "Error:         %s\n", text(m.Error))
	if len(m.History) > 0 {
		fmt.Fprintln(w, "History:")
		for _, h := range m.History {
			fmt.Fprintf(w, "  %s  attempt %d  %s\n", h.At.UTC().Format(time.RFC3339), h.Attempt, text(h.Error))
		}
	}
	if len(m.Headers) > 0 {
		fmt.Fprintln(w, "Headers:")
		keys := make([]string, 0, len(m.Headers))
		for k := range m.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  %s: %s\n", text(k), text(m.Headers[k]))
		}
	}
	printOperations(w, m)
	if m.Original != nil {
		fmt.Fprintf(w, "Body (%d bytes, as edited):\n%s\n", len(m.Body), textshow.Printable(m.Body))
		printOriginal(w, m)
		return
	}
	fmt.Fprintf(w, "Body (%d bytes):\n%s\n", len(m.Body), textshow.Printable(m.Body))
}

func eventIDText(m idemmsg.FailedMessage) string {
	if m.EventID == [16]byte{} {
		return "-"
	}
	return m.EventID.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
