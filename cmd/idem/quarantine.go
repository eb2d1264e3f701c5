package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	idemmsg "github.com/idem-go/idem"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/textshow"
)

// quarantineUsage is the part of "idem help failed" about --relay.
const quarantineUsage = `

Relay quarantine (--relay):
  idem failed list   --relay [--db URL] [--event NAME] [--aggregate-type T] [--aggregate-id ID]
                     [--since T] [--limit N] [--after-seq SEQ]
  idem failed groups --relay [--db URL] [filters] [--json]
  idem failed show   --relay [--db URL] SEQ
  idem failed retry  --relay [--db URL] SEQ... | --all [filters] | --group GROUP [--yes] [filters]
  idem failed remove --relay [--db URL] [--yes] SEQ... | --all [filters] | --group GROUP [filters]

With --relay, the commands work on the relay's quarantine in the producer's
outbox (--db is the database the relay reads) instead of a consumer's failure
store. The relay quarantines a row it cannot turn into a message (an empty
id or one over 64 bytes, headers that are not a JSON object, a missing event
name...) at its first claim, and a row the broker refused itself (unroutable, nacked,
rejected, too large) on each of "idem relay --quarantine-after" attempts.
A broker that is down or slow never gets a row quarantined. A quarantined row
is not published, and the later rows of its aggregate wait behind it; every
other aggregate flows. Rows are identified by their seq (insertion order);
show prints a row's columns as stored, quoted where they are not printable.

The CDC relay (idem cdc) quarantines the same way, in the same table, a
row or WAL message the broker refused on each of "idem cdc
--quarantine-after" attempts; there the later events of its aggregate go on.

retry --relay ends the quarantine and clears the attempt count: the relay
publishes the row at its next claim, then the rows behind it, in order. On
PostgreSQL the row is written again (same seq), which the CDC relay reads as
a new insert and publishes. Fix
the cause first (bind a queue for the routing key, repair the row with SQL),
or the relay quarantines it again. remove --relay deletes rows for good:
their events are never published, and the rows behind them go on. It asks
for confirmation unless --yes.

groups --relay sorts the quarantined rows into groups by cause, as groups
does a consumer's messages: the class (unreadable: the row cannot become a
message; refused: the broker refused it on every attempt; other) and the
normalized error. retry --relay --group GROUP and remove --relay --group
GROUP act on the group's rows after one confirmation (--yes skips it).

Examples:
  idem failed list --relay --since 24h
  idem failed show --relay 1042
  idem failed retry --relay --all --event order.order.shipped.v1
  idem failed remove --relay 1042 --yes
  idem failed groups --relay
  idem failed retry --relay --group 5be0c2a41f3d --yes`

// quarantineFlags are the flags of "idem failed" for the relay's quarantine;
// the command's other flags (--event, --since, --limit, --all, --yes) are
// read from the same flag set.
type quarantineFlags struct {
	fs            *flag.FlagSet
	db            *dbFlags
	relay         bool
	afterSeq      int64
	aggregateType string
	aggregateID   string
}

// registerQuarantineFlags declares the flags of "idem failed --relay" on fs,
// whose --db flag db holds.
func registerQuarantineFlags(fs *flag.FlagSet, db *dbFlags) *quarantineFlags {
	q := &quarantineFlags{fs: fs, db: db}
	fs.BoolVar(&q.relay, "relay", false, "work on the relay's quarantined outbox rows instead of a consumer's failure store")
	fs.Int64Var(&q.afterSeq, "after-seq", 0, "with list --relay: rows after this seq (the next page)")
	fs.StringVar(&q.aggregateType, "aggregate-type", "", "with --relay: only rows of this aggregate type")
	fs.StringVar(&q.aggregateID, "aggregate-id", "", "with --relay: only rows of this aggregate id")
	return q
}

// flag returns the value of one of the command's flags as text.
func (q *quarantineFlags) flag(name string) string {
	if f := q.fs.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// isSet reports whether the command line set the flag name.
func (q *quarantineFlags) isSet(name string) bool {
	set := false
	q.fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// quarantinePage is how many rows list, retry --all and remove --all read
// per query.
const quarantinePage = 500

// run runs "idem failed <action> --relay".
func (q *quarantineFlags) run(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("want one of list, groups, show, retry, remove")
	}
	action, rest := args[0], args[1:]
	for _, name := range []string{"consumer", "broker"} {
		if q.isSet(name) {
			return usagef("--%s does not apply with --relay: quarantined rows are outbox rows, and the relay publishes them again", name)
		}
	}
	since, err := parseTime("since", q.flag("since"), time.Now())
	if err != nil {
		return err
	}
	limit, err := strconv.Atoi(q.flag("limit"))
	if err != nil || limit < 0 {
		return usagef("--limit %s: want 0 (all) or more", q.flag("limit"))
	}
	if q.afterSeq < 0 {
		return usagef("--after-seq %d: want a seq (0 or more)", q.afterSeq)
	}
	all := q.flag("all") == "true"
	group := q.flag("group")
	if err := checkGroupFlags(action, rest, group, all, q.flag("json") == "true"); err != nil {
		return err
	}
	filter := driver.QuarantineFilter{
		EventName:     q.flag("event"),
		AggregateType: q.aggregateType,
		AggregateID:   q.aggregateID,
		Since:         since,
		AfterSeq:      q.afterSeq,
	}
	switch action {
	case "list", "groups":
		if len(rest) != 0 {
			return usagef("%s takes no arguments", action)
		}
	case "show":
		if len(rest) != 1 {
			return usagef("show --relay takes one row seq")
		}
	case "retry", "remove":
		if all && len(rest) > 0 {
			return usagef("give row seqs or --all, not both")
		}
		if !all && group == "" && len(rest) == 0 {
			return usagef("%s --relay needs row seqs (see \"idem failed list --relay\"), --group GROUP (see \"idem failed groups --relay\") or --all", action)
		}
	default:
		return usagef("unknown action %q: want list, groups, show, retry or remove", action)
	}
	var seqs []int64
	for _, a := range rest {
		seq, err := strconv.ParseInt(a, 10, 64)
		if err != nil || seq <= 0 {
			return usagef("row seq %q: want a positive integer (see \"idem failed list --relay\")", a)
		}
		seqs = append(seqs, seq)
	}

	conn, err := q.db.open(ctx, e)
	if err != nil {
		return err
	}
	defer conn.Close()
	rd := conn.SQL.Dialect()
	ex := conn.SQL.Pool()
	if action == "groups" || group != "" {
		return q.quarantineGroups(ctx, e, rd, ex, filter, action, group)
	}

	if action == "list" {
		filter.Limit = limit
		if limit == 0 {
			filter.Limit = quarantinePage
		}
		var rows []driver.QuarantinedRow
		for {
			page, err := rd.ListQuarantined(ctx, ex, withLimit(filter, filter.Limit+1))
			if err != nil {
				return err
			}
			more := len(page) > filter.Limit
			if more {
				page = page[:filter.Limit]
			}
			rows = append(rows, page...)
			if !more || limit != 0 {
				printQuarantineList(e.stdout, rows, more)
				return nil
			}
			filter.AfterSeq = page[len(page)-1].Seq
		}
	}

	var rows []driver.QuarantinedRow
	if all {
		filter.Limit = quarantinePage
		for {
			page, err := rd.ListQuarantined(ctx, ex, filter)
			if err != nil {
				return err
			}
			rows = append(rows, page...)
			if len(page) < filter.Limit {
				break
			}
			filter.AfterSeq = page[len(page)-1].Seq
		}
	} else {
		for _, seq := range seqs {
			row, err := rd.GetQuarantined(ctx, ex, seq)
			if errors.Is(err, idemmsg.ErrNotFound) {
				return fmt.Errorf("no quarantined outbox row with seq %d (see \"idem failed list --relay\")", seq)
			}
			if err != nil {
				return err
			}
			rows = append(rows, row)
		}
	}

	switch action {
	case "show":
		printQuarantined(e.stdout, rows[0])
		return nil
	case "retry":
		if len(rows) == 0 {
			fmt.Fprintln(e.stdout, "No quarantined outbox row matches.")
			return nil
		}
		for _, row := range rows {
			n, err := rd.RequeueQuarantined(ctx, ex, []int64{row.Seq})
			if err != nil {
				return err
			}
			if n == 0 {
				fmt.Fprintf(e.stderr, "idem failed retry --relay: seq %d is no longer quarantined; left alone\n", row.Seq)
				continue
			}
			fmt.Fprintf(e.stdout, "Requeued seq %d (%s): the relay publishes it at its next claim\n", row.Seq, rowSummary(row))
			if row.Unreadable != nil {
				fmt.Fprintf(e.stderr, "idem failed retry --relay: seq %d cannot be published as it is, and will be quarantined again: %v\n", row.Seq, row.Unreadable)
			}
		}
		return nil
	}

	// remove
	if len(rows) == 0 {
		fmt.Fprintln(e.stdout, "No quarantined outbox row matches.")
		return nil
	}
	if q.flag("yes") != "true" && !confirm(e, fmt.Sprintf("Remove %d quarantined outbox row(s) for good? Their events will never be published.", len(rows))) {
		return errors.New("not confirmed; nothing removed (pass --yes to skip the question)")
	}
	for _, row := range rows {
		n, err := rd.DeleteQuarantined(ctx, ex, []int64{row.Seq})
		if err != nil {
			return err
		}
		if n == 0 {
			fmt.Fprintf(e.stderr, "idem failed remove --relay: seq %d is no longer quarantined; left alone\n", row.Seq)
			continue
		}
		fmt.Fprintf(e.stdout, "Removed seq %d (%s)\n", row.Seq, rowSummary(row))
	}
	return nil
}

func withLimit(f driver.QuarantineFilter, limit int) driver.QuarantineFilter {
	f.Limit = limit
	return f
}

// rowSummary names a row on one line: aggregate, event name and id, quoted
// where they are not printable.
func rowSummary(r driver.QuarantinedRow) string {
	return fmt.Sprintf("%s/%s %s %s", textshow.Printable([]byte(r.AggregateType)), textshow.Printable([]byte(r.AggregateID)),
		orDash(textshow.Printable([]byte(r.Type))), textshow.Printable([]byte(r.RawID)))
}

func printQuarantineList(w io.Writer, rows []driver.QuarantinedRow, more bool) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "No quarantined outbox row matches.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tID\tAGGREGATE\tEVENT\tATTEMPTS\tQUARANTINED AT\tERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s/%s\t%s\t%d\t%s\t%s\n", r.Seq, textshow.OneLine(textshow.Printable([]byte(r.RawID)), 40),
			textshow.OneLine(textshow.Printable([]byte(r.AggregateType)), 30), textshow.OneLine(textshow.Printable([]byte(r.AggregateID)), 40),
			orDash(textshow.OneLine(textshow.Printable([]byte(r.Type)), 60)), r.Attempts, r.QuarantinedAt.UTC().Format(time.RFC3339),
			textshow.OneLine(r.LastError, 100))
	}
	_ = tw.Flush()
	if more {
		fmt.Fprintf(w, "More rows follow: add --after-seq %d for the next page.\n", rows[len(rows)-1].Seq)
	}
}

func printQuarantined(w io.Writer, r driver.QuarantinedRow) {
	fmt.Fprintf(w, "Seq:             %d\n", r.Seq)
	fmt.Fprintf(w, "ID:              %s\n", textshow.Printable([]byte(r.RawID)))
	if idemmsg.IsDerivedEventID(r.RawID) {
		fmt.Fprintf(w, "Event ID:        %s (derived from the id, which is not a UUID; header %s)\n", r.ID, idemmsg.HeaderOriginalID)
	}
	fmt.Fprintf(w, "Aggregate type:  %s\n", textshow.Printable([]byte(r.AggregateType)))
	fmt.Fprintf(w, "Aggregate ID:    %s\n", textshow.Printable([]byte(r.AggregateID)))
	fmt.Fprintf(w, "Event:           %s\n", orDash(textshow.Printable([]byte(r.Type))))
	fmt.Fprintf(w, "Version:         %d\n", r.AggregateVersion)
	if !r.OccurredAt.IsZero() {
		fmt.Fprintf(w, "Occurred at:     %s\n", r.OccurredAt.UTC().Format(time.RFC3339Nano))
	}
	if !r.CreatedAt.IsZero() {
		fmt.Fprintf(w, "Written at:      %s\n", r.CreatedAt.UTC().Format(time.RFC3339Nano))
	}
	fmt.Fprintf(w, "Quarantined at:  %s\n", r.QuarantinedAt.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "Attempts:        %d\n", r.Attempts)
	fmt.Fprintf(w, "Error:           %s\n", r.LastError)
	if r.Unreadable != nil && r.Unreadable.Error() != r.LastError {
		fmt.Fprintf(w, "Unreadable:      %v\n", r.Unreadable)
	}
	if r.ContentType != "" {
		fmt.Fprintf(w, "Content type:    %s\n", textshow.Printable([]byte(r.ContentType)))
	}
	fmt.Fprintf(w, "Headers (%d bytes):\n%s\n", len(r.RawHeaders), textshow.Printable(r.RawHeaders))
	if r.Payload == nil {
		fmt.Fprintln(w, "Payload:         NULL")
		return
	}
	fmt.Fprintf(w, "Payload (%d bytes):\n%s\n", len(r.Payload), textshow.Printable(r.Payload))
}
