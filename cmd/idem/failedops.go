package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/internal/textshow"
	"github.com/idem-go/idem/outbox"
)

// The operators' actions of "idem failed" beyond retry and remove: edit,
// archive and retry --to-consumer, each recorded in the entry's audit
// trail with --by, and the failure notices of --failure-events.

// failedOpsUsage is the part of "idem failed"'s usage about them.
const failedOpsUsage = `

edit replaces the body (--body-file FILE, - for the standard input) and
headers (--header NAME=VALUE sets one, --drop-header NAME removes one) of a
stored message; retry then sends the edited message. The event id, name and
aggregate stay as stored, and the message as first received stays readable
(show prints it). Each edit, retry, redirect and archive is recorded in the
message's audit trail (show prints it) with --by (default $USER) and the
time.

retry --to-consumer C sends stored messages, by ID, to consumer C only
instead of the queue they came from (RabbitMQ: C's queue; NATS: C's durable
consumer; not Kafka, whose consumers share topics), as plain deliveries
that C deduplicates on their event id, then archives them. Messages held
behind one stay, to retry or remove.

archive keeps stored messages out of the lists, counts and status instead
of removing them: list --archived lists them, show still shows them, and
they hold their aggregate no longer. An archived message that is parked
again (a copy of it fails) is listed again. --archived selects the archived
messages for list, groups, and remove --all or --group. The purge of the
failure store (idem purge --failed-older-than) removes archived messages
too.

--failure-events writes a notice of each message removed, archived or
redirected (idem.failure.message.resolved.v1, without the body) into the
outbox of the consumer's database, in the same transaction, for the
services that follow failures (see docs/OPERATIONS.md, "Failure
notices").`

// failedOpsFlags holds the flags of these actions.
type failedOpsFlags struct {
	by            string
	toConsumer    string
	bodyFile      string
	setHeaders    map[string]string
	dropHeaders   []string
	archived      bool
	failureEvents bool
	prefix        string
}

// register declares the flags on fs.
func (f *failedOpsFlags) register(fs *flag.FlagSet) {
	f.setHeaders = map[string]string{}
	fs.StringVar(&f.by, "by", "", "who acts, recorded in the audit trail of the messages (default $USER)")
	fs.StringVar(&f.toConsumer, "to-consumer", "", "with retry: send the messages to this consumer only instead, and archive them")
	fs.StringVar(&f.bodyFile, "body-file", "", "with edit: the new body, read from this file (- for the standard input)")
	fs.Func("header", "with edit: set header `NAME=VALUE` (repeat for more)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return errors.New("want NAME=VALUE")
		}
		f.setHeaders[k] = v
		return nil
	})
	fs.Func("drop-header", "with edit: remove header `NAME` (repeat for more)", func(s string) error {
		if s == "" {
			return errors.New("want a header name")
		}
		f.dropHeaders = append(f.dropHeaders, s)
		return nil
	})
	fs.BoolVar(&f.archived, "archived", false, "with list, groups, and remove --all or --group: the archived messages instead of the others")
	fs.StringVar(&f.prefix, "prefix", "", "with --to-consumer: prefix of the broker's names, as the consumers subscribed with (queues <prefix>.<consumer>.events, stream <PREFIX>_EVENTS)")
	fs.BoolVar(&f.failureEvents, "failure-events", false, "write a notice of each message removed, archived or redirected into the database's outbox")
}

// any reports whether any of the flags is set.
func (f *failedOpsFlags) any() bool {
	return f.by != "" || f.toConsumer != "" || f.prefix != "" || f.bodyFile != "" || len(f.setHeaders) > 0 || len(f.dropHeaders) > 0 || f.archived || f.failureEvents
}

// check refuses the flags that do not go with action.
func (f *failedOpsFlags) check(action string, all bool, group string) error {
	editing := f.bodyFile != "" || len(f.setHeaders) > 0 || len(f.dropHeaders) > 0
	switch {
	case editing && action != "edit":
		return usagef("--body-file, --header and --drop-header go with edit")
	case action == "edit" && !editing:
		return usagef("edit needs --body-file, --header or --drop-header")
	case f.prefix != "" && f.toConsumer == "":
		return usagef("--prefix goes with --to-consumer")
	case f.toConsumer != "" && action != "retry":
		return usagef("--to-consumer goes with retry")
	case f.toConsumer != "" && (all || group != ""):
		return usagef("--to-consumer takes message IDs, not --all or --group")
	case f.archived && action != "list" && action != "groups" && (action != "remove" || (!all && group == "")):
		return usagef("--archived goes with list, groups, and remove --all or --group")
	}
	return nil
}

// store returns store acting as --by (default $USER), with the notices of
// --failure-events written through conn.
func (f *failedOpsFlags) store(e *env, conn *registry.Database, store *inbox.FailureStore) *inbox.FailureStore {
	store = store.As(cmp.Or(f.by, e.getenv("USER")))
	if f.failureEvents {
		store = store.WithFailureHook(outbox.FailureEvents(outbox.NewWriter(conn.SQL), outbox.FailureEventsConfig{}))
	}
	return store
}

// edit edits message m as the flags say.
func (f *failedOpsFlags) edit(ctx context.Context, e *env, store *inbox.FailureStore, m idemmsg.FailedMessage) error {
	body := m.Body
	if f.bodyFile != "" {
		var err error
		if body, err = readBody(e, f.bodyFile); err != nil {
			return err
		}
	}
	headers := maps.Clone(m.Headers)
	if headers == nil {
		headers = map[string]string{}
	}
	for _, k := range f.dropHeaders {
		if _, ok := headers[k]; !ok {
			return fmt.Errorf("--drop-header %s: message %d has no such header", textshow.Printable([]byte(k)), m.ID)
		}
		delete(headers, k)
	}
	maps.Copy(headers, f.setHeaders)
	if err := store.Edit(ctx, m.ID, body, headers); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "Edited %d (%s). Retry it to send the edited message: idem failed retry %d\n", m.ID, inbox.EditDetail(m, body, headers), m.ID)
	return nil
}

// readBody reads the file of --body-file, or the standard input for "-".
func readBody(e *env, name string) ([]byte, error) {
	if name == "-" {
		body, err := io.ReadAll(io.LimitReader(e.stdin, maxEditedBody+1))
		if err == nil && len(body) > maxEditedBody {
			err = fmt.Errorf("--body-file -: over the %d bytes a message may hold here", maxEditedBody)
		}
		return body, err
	}
	fi, err := os.Stat(name)
	if err != nil {
		return nil, fmt.Errorf("--body-file: %w", err)
	}
	if fi.Size() > maxEditedBody {
		return nil, fmt.Errorf("--body-file %s: %d bytes, over the %d a message may hold here", name, fi.Size(), maxEditedBody)
	}
	return os.ReadFile(name)
}

// maxEditedBody bounds an edited body: what a broker takes in one message.
const maxEditedBody = 64 << 20

// archiveFailed archives msgs.
func archiveFailed(ctx context.Context, e *env, store *inbox.FailureStore, msgs []idemmsg.FailedMessage) error {
	for _, m := range msgs {
		ok, err := store.Archive(ctx, m.ID)
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintf(e.stdout, "%d is archived already, or gone\n", m.ID)
			continue
		}
		reportArchived(ctx, e, store, m)
	}
	return nil
}

// reportArchived says that m was archived, and how to find the messages
// held behind it.
func reportArchived(ctx context.Context, e *env, store *inbox.FailureStore, m idemmsg.FailedMessage) {
	fmt.Fprintf(e.stdout, "Archived %d (%s %s)\n", m.ID, textshow.Printable([]byte(m.EventName)), eventIDText(m))
	reportHeld(ctx, e, store, m)
}

// redirectFailed sends msgs to consumer only, and archives them.
func redirectFailed(ctx context.Context, e *env, store *inbox.FailureStore, brokerURL, prefix, consumer string, msgs []idemmsg.FailedMessage) error {
	pub, closePub, err := openBrokerAs[broker.ConsumerPublisher](ctx, e, brokerURL, prefix,
		"cannot send a message to one consumer only (its publisher is not a broker.ConsumerPublisher: Kafka's consumer groups share topics)")
	if err != nil {
		return err
	}
	defer closePub()
	failed := 0
	for _, m := range msgs {
		if err := store.Redirect(ctx, pub, m, consumer); err != nil {
			fmt.Fprintf(e.stderr, "idem failed retry: %d: %v\n", m.ID, err)
			failed++
			continue
		}
		fmt.Fprintf(e.stdout, "Sent %d (%s %s) to consumer %s, and archived it\n", m.ID, textshow.Printable([]byte(m.EventName)),
			eventIDText(m), textshow.Printable([]byte(consumer)))
		reportHeld(ctx, e, store, m)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d message(s) not sent", failed, len(msgs))
	}
	return nil
}

// openBrokerAs opens the broker at brokerURL (default $IDEM_BROKER_URL),
// with the names of prefix (registry.OpenPrefixed), whose publisher must be
// an I; cannot says why when it is not.
func openBrokerAs[I any](ctx context.Context, e *env, brokerURL, prefix, cannot string) (I, func(), error) {
	var zero I
	if brokerURL == "" {
		brokerURL = e.getenv("IDEM_BROKER_URL")
	}
	pub, err := registry.OpenPrefixed(ctx, brokerURL, prefix)
	if err != nil {
		return zero, nil, err
	}
	i, ok := pub.(I)
	if !ok {
		_ = pub.Close()
		return zero, nil, fmt.Errorf("the broker at %s %s", broker.RedactURL(brokerURL), cannot)
	}
	return i, func() { _ = pub.Close() }, nil
}

// printOperations prints what operators did to m: the message as received
// when it was edited, when it was archived, and its audit trail.
func printOperations(w io.Writer, m idemmsg.FailedMessage) {
	text := func(s string) string { return textshow.Printable([]byte(s)) }
	if !m.Archived.IsZero() {
		fmt.Fprintf(w, "Archived:      %s\n", m.Archived.UTC().Format("2006-01-02T15:04:05.999999999Z07:00"))
	}
	if len(m.Actions) > 0 {
		fmt.Fprintln(w, "Actions:")
		for _, a := range m.Actions {
			by := a.By
			if by == "" {
				by = "(unknown)"
			}
			fmt.Fprintf(w, "  %s  %-8s by %s", a.At.UTC().Format("2006-01-02T15:04:05Z07:00"), a.Action, text(by))
			if a.Detail != "" {
				fmt.Fprintf(w, ": %s", text(a.Detail))
			}
			fmt.Fprintln(w)
		}
	}
}

// printOriginal prints the message as received of an edited entry.
func printOriginal(w io.Writer, m idemmsg.FailedMessage) {
	if m.Original == nil {
		return
	}
	fmt.Fprintln(w, "Original headers (as received):")
	for _, k := range slices.Sorted(maps.Keys(m.Original.Headers)) {
		fmt.Fprintf(w, "  %s: %s\n", textshow.Printable([]byte(k)), textshow.Printable([]byte(m.Original.Headers[k])))
	}
	fmt.Fprintf(w, "Original body (%d bytes, as received):\n%s\n", len(m.Original.Body), textshow.Printable(m.Original.Body))
}
