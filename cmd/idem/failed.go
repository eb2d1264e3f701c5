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
	"unicode/utf8"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/brokeropen"
)

// redeliverer is a publisher that can send a message back to the queue (or
// stream) it was received from, rather than to every subscriber of its
// event: broker/amqp's Publisher.
type redeliverer interface {
	Redeliver(ctx context.Context, source string, msgs []idemmsg.Message) error
}

func init() {
	register(&command{
		name:    "failed",
		summary: "list, show, retry or remove messages in a consumer's failure store",
		usage: `Usage:
  idem failed list   [--db URL] [--consumer C] [--event NAME] [--since T] [--limit N]
  idem failed show   [--db URL] ID
  idem failed retry  [--db URL] [--broker URL] ID... | --all [--consumer C] [--event NAME] [--since T]
  idem failed remove [--db URL] [--yes] ID... | --all [--consumer C] [--event NAME] [--since T]

The failure store (table failed_message of a consumer's database) keeps the
messages a consumer could not decode, or that failed on every attempt or with
a permanent error, exactly as they were received: body, headers, the queue
they came from, the error history and the attempt count.

retry publishes each stored message again, unchanged (same body, same event
id), to the queue it was received from only, and removes it from the store
once the broker confirmed it. Its attempt count starts again at 1. Fix the
handler first: the consumer deduplicates on the event id, so a message that
was in fact applied meanwhile is skipped.

remove deletes stored messages; it asks for confirmation unless --yes.

--since takes an RFC 3339 time, a date, or a duration back from now (2h).

Examples:
  idem failed list --consumer stock --since 24h
  idem failed show 42
  idem failed retry 42 --broker amqp://guest:guest@localhost:5672/
  idem failed remove --all --event order.order.placed.v0 --yes` + quarantineUsage,
		setup: func(fs *flag.FlagSet) runFunc {
			var db dbFlags
			db.register(fs)
			quarantine := registerQuarantineFlags(fs, &db)
			brokerURL := fs.String("broker", "", "with retry: broker URL, e.g. amqp://user:pass@localhost:5672/ (default $IDEM_BROKER_URL)")
			consumer := fs.String("consumer", "", "only messages of this consumer name")
			event := fs.String("event", "", "only messages of this event name")
			since := fs.String("since", "", "only messages failed since this time or duration back (24h)")
			limit := fs.Int("limit", 100, "with list: the most messages to list (0: all)")
			all := fs.Bool("all", false, "with retry or remove: every message matching the filters instead of IDs")
			yes := fs.Bool("yes", false, "with remove: do not ask for confirmation")
			return func(ctx context.Context, e *env, args []string) error {
				if quarantine.relay {
					return quarantine.run(ctx, e, args)
				}
				if len(args) == 0 {
					return usagef("want one of list, show, retry, remove")
				}
				action, rest := args[0], args[1:]
				sinceT, err := parseTime("since", *since, time.Now())
				if err != nil {
					return err
				}
				filter := driver.FailedFilter{Consumer: *consumer, EventName: *event, Since: sinceT}
				var ids []int64
				switch action {
				case "list":
					if len(rest) != 0 {
						return usagef("list takes no arguments")
					}
					if *limit < 0 {
						return usagef("--limit %d: want 0 (all) or more", *limit)
					}
					filter.Limit = *limit
				case "show":
					if len(rest) != 1 {
						return usagef("show takes one message ID")
					}
				case "retry", "remove":
					if *all && len(rest) > 0 {
						return usagef("give message IDs or --all, not both")
					}
					if !*all && len(rest) == 0 {
						return usagef("%s needs message IDs (see \"idem failed list\") or --all", action)
					}
				default:
					return usagef("unknown action %q: want list, show, retry or remove", action)
				}
				if action != "list" {
					for _, a := range rest {
						id, err := strconv.ParseInt(a, 10, 64)
						if err != nil || id <= 0 {
							return usagef("message ID %q: want a positive integer", a)
						}
						ids = append(ids, id)
					}
				}

				conn, err := db.open(ctx, e)
				if err != nil {
					return err
				}
				defer conn.Close()
				store := inbox.NewFailureStore(conn.Dialect(), conn.SQL.Pool())

				var msgs []driver.FailedMessage
				if action == "list" || *all {
					msgs, err = store.List(ctx, filter)
					if err != nil {
						return err
					}
				} else {
					for _, id := range ids {
						m, err := store.Get(ctx, id)
						if errors.Is(err, driver.ErrNotFound) {
							return fmt.Errorf("no failed message with ID %d", id)
						}
						if err != nil {
							return err
						}
						msgs = append(msgs, m)
					}
				}

				switch action {
				case "list":
					printFailedList(e.stdout, msgs)
					return nil
				case "show":
					printFailed(e.stdout, msgs[0])
					return nil
				case "remove":
					if len(msgs) == 0 {
						fmt.Fprintln(e.stdout, "No failed message matches.")
						return nil
					}
					if !*yes && !confirm(e, fmt.Sprintf("Remove %d failed message(s) for good?", len(msgs))) {
						return errors.New("not confirmed; nothing removed (pass --yes to skip the question)")
					}
					for _, m := range msgs {
						if _, err := store.Remove(ctx, m.ID); err != nil {
							return err
						}
						fmt.Fprintf(e.stdout, "Removed %d (%s %s)\n", m.ID, m.EventName, m.EventID)
					}
					return nil
				}

				// retry
				if len(msgs) == 0 {
					fmt.Fprintln(e.stdout, "No failed message matches.")
					return nil
				}
				u := *brokerURL
				if u == "" {
					u = e.getenv("IDEM_BROKER_URL")
				}
				pub, err := brokeropen.Open(ctx, u)
				if err != nil {
					return err
				}
				defer pub.Close()
				rd, ok := pub.(redeliverer)
				if !ok {
					return fmt.Errorf("the broker at %s cannot send a message back to one queue", broker.RedactURL(u))
				}
				var failed int
				for _, m := range msgs {
					if m.Source == "" {
						fmt.Fprintf(e.stderr, "idem failed retry: %d: the queue it came from is unknown; not retried\n", m.ID)
						failed++
						continue
					}
					msg := idemmsg.Message{EventID: m.EventID, EventName: m.EventName, Key: m.Key, Headers: m.Headers, Body: m.Body}
					if err := rd.Redeliver(ctx, m.Source, []idemmsg.Message{msg}); err != nil {
						fmt.Fprintf(e.stderr, "idem failed retry: %d: %v\n", m.ID, err)
						failed++
						continue
					}
					if _, err := store.Remove(ctx, m.ID); err != nil {
						return fmt.Errorf("message %d was published again but could not be removed from the store (the consumer will skip the copy if it applies it twice): %w", m.ID, err)
					}
					fmt.Fprintf(e.stdout, "Retried %d (%s %s) to %s\n", m.ID, m.EventName, m.EventID, m.Source)
				}
				if failed > 0 {
					return fmt.Errorf("%d of %d message(s) not retried", failed, len(msgs))
				}
				return nil
			}
		},
	})
}

func printFailedList(w io.Writer, msgs []driver.FailedMessage) {
	if len(msgs) == 0 {
		fmt.Fprintln(w, "No failed message matches.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONSUMER\tEVENT\tEVENT ID\tATTEMPTS\tFAILED AT\tERROR")
	for _, m := range msgs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", m.ID, m.Consumer, orDash(m.EventName), eventIDText(m),
			m.Attempts, m.LastFailed.UTC().Format(time.RFC3339), oneLine(m.Error, 100))
	}
	_ = tw.Flush()
}

func printFailed(w io.Writer, m driver.FailedMessage) {
	fmt.Fprintf(w, "ID:            %d\n", m.ID)
	fmt.Fprintf(w, "Consumer:      %s\n", m.Consumer)
	fmt.Fprintf(w, "Source:        %s\n", orDash(m.Source))
	fmt.Fprintf(w, "Event:         %s\n", orDash(m.EventName))
	fmt.Fprintf(w, "Event ID:      %s\n", eventIDText(m))
	if len(m.Key) > 0 {
		fmt.Fprintf(w, "Key:           %s\n", printable(m.Key))
	}
	fmt.Fprintf(w, "Attempts:      %d\n", m.Attempts)
	fmt.Fprintf(w, "First failed:  %s\n", m.FirstFailed.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "Last failed:   %s\n", m.LastFailed.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "Error:         %s\n", m.Error)
	if len(m.History) > 0 {
		fmt.Fprintln(w, "History:")
		for _, h := range m.History {
			fmt.Fprintf(w, "  %s  attempt %d  %s\n", h.At.UTC().Format(time.RFC3339), h.Attempt, h.Error)
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
			fmt.Fprintf(w, "  %s: %s\n", k, m.Headers[k])
		}
	}
	fmt.Fprintf(w, "Body (%d bytes):\n%s\n", len(m.Body), printable(m.Body))
}

func eventIDText(m driver.FailedMessage) string {
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

// printable returns b as text when it is valid UTF-8 without control
// characters other than whitespace, else as a Go-quoted string.
func printable(b []byte) string {
	if utf8.Valid(b) {
		ok := true
		for _, r := range string(b) {
			if r < 0x20 && r != '\n' && r != '\r' && r != '\t' {
				ok = false
				break
			}
		}
		if ok {
			return string(b)
		}
	}
	return strconv.Quote(string(b))
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
