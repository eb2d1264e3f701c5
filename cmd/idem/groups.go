package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/failgroup"
	"github.com/idem-go/idem/internal/progress"
	"github.com/idem-go/idem/internal/textshow"
)

// checkGroupFlags checks --group and --json against the action and its
// arguments.
func checkGroupFlags(action string, rest []string, group string, all, asJSON bool) error {
	if asJSON && action != "groups" {
		return usagef("--json goes with groups only")
	}
	if group == "" {
		return nil
	}
	switch {
	case action != "retry" && action != "remove" && action != "archive":
		return usagef("--group goes with retry, archive or remove (see \"idem failed groups\")")
	case all || len(rest) > 0:
		return usagef("give message IDs, --all or --group, one of them")
	case !failgroup.ValidID(group):
		return usagef("--group %q: want a group id of %d hex digits, as \"idem failed groups\" prints it", group, failgroup.IDLen)
	}
	return nil
}

// listGroups prints the groups of the messages matching filter.
func listGroups(ctx context.Context, w io.Writer, store *inbox.FailureStore, filter idemmsg.FailedFilter, asJSON bool) error {
	groups, err := store.Groups(ctx, filter)
	if err != nil {
		return err
	}
	return printGroups(w, groups, asJSON, "No failed message matches.", "")
}

// printGroups prints rows as a table, or as JSON; relay is the flag the
// hint's commands need ("" or " --relay").
func printGroups(w io.Writer, rows []inbox.FailureGroup, asJSON bool, none, relay string) error {
	if asJSON {
		if rows == nil {
			rows = []inbox.FailureGroup{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, none)
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tCONSUMER\tCLASS\tCOUNT\tFIRST FAILED\tLAST FAILED\tCAUSE")
	total := 0
	for _, r := range rows {
		total += r.Count
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, textshow.OneLine(textshow.Printable([]byte(r.Consumer)), 30), r.Class, r.Count,
			r.FirstFailed.UTC().Format(time.RFC3339), r.LastFailed.UTC().Format(time.RFC3339),
			textshow.OneLine(textshow.Printable([]byte(r.Cause)), 120))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%d group(s), %d message(s). Act on a group: idem failed retry%s --group GROUP, idem failed remove%s --group GROUP\n",
		len(rows), total, relay, relay)
	return nil
}

// groupFailed retries or removes the messages of group id among those
// matching filter, after one confirmation unless yes.
func groupFailed(ctx context.Context, e *env, store *inbox.FailureStore, filter idemmsg.FailedFilter, action, id string, yes bool, brokerURL string) error {
	groups, err := store.Groups(ctx, filter)
	if err != nil {
		return err
	}
	var g inbox.FailureGroup
	for _, x := range groups {
		if x.ID == id {
			g = x
		}
	}
	if g.ID == "" {
		return fmt.Errorf("no failed message of group %s matches (see \"idem failed groups\")", id)
	}
	what := fmt.Sprintf("the %d failed message(s) of group %s (%s, %s: %s)", g.Count, g.ID, textshow.Printable([]byte(g.Consumer)), g.Class,
		textshow.OneLine(textshow.Printable([]byte(g.Cause)), 100))
	question := map[string]string{"retry": "Retry " + what + "?", "remove": "Remove " + what + " for good?", "archive": "Archive " + what + "?"}[action]
	if !yes && !confirm(e, question) {
		return fmt.Errorf("not confirmed; nothing %s (pass --yes to skip the question)", map[string]string{"retry": "retried", "remove": "removed", "archive": "archived"}[action])
	}
	if action == "archive" {
		n, err := store.ArchiveGroup(ctx, filter, id, func(m idemmsg.FailedMessage) { reportArchived(ctx, e, store, m) })
		if err != nil {
			return fmt.Errorf("after archiving %d message(s) of group %s: %w", n, id, err)
		}
		fmt.Fprintf(e.stdout, "Archived %d failed message(s) of group %s.\n", n, id)
		return nil
	}
	if action == "remove" {
		n, err := store.RemoveGroup(ctx, filter, id, func(m idemmsg.FailedMessage) { reportRemoved(ctx, e, store, m) })
		if err != nil {
			return fmt.Errorf("after removing %d message(s) of group %s: %w", n, id, err)
		}
		fmt.Fprintf(e.stdout, "Removed %d failed message(s) of group %s.\n", n, id)
		return nil
	}
	rd, closePub, err := openRedeliverer(ctx, e, brokerURL)
	if err != nil {
		return err
	}
	defer closePub()
	rep, err := newProgress(e, "failed retry", "messages", int64(g.Count))
	if err != nil {
		return err
	}
	defer rep.Finish()
	pe := withProgress(e, rep)
	held := 0
	found, sent, failed, err := store.RetryGroup(ctx, rd, filter, id, func(m idemmsg.FailedMessage, inGroup bool, err error) {
		if !inGroup && err == nil {
			held++
		}
		reportRetry(pe, m, err)
		if inGroup {
			rep.Add(1)
		}
	})
	rep.Finish(progress.Count{Name: "held behind them", N: int64(held)}, progress.Count{Name: "not retried", N: int64(failed)})
	summary := fmt.Sprintf("Retried %d failed message(s) of group %s", sent-held, id)
	if held > 0 {
		summary += fmt.Sprintf(", and %d held behind them", held)
	}
	fmt.Fprintln(e.stdout, summary+".")
	if err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d message(s) not retried (%d of the group)", failed, sent+failed, found)
	}
	return nil
}

// quarantineGroups runs "idem failed groups --relay" and "idem failed
// retry|remove --relay --group ID".
func (q *quarantineFlags) quarantineGroups(ctx context.Context, e *env, rd driver.RelayDialect, ex driver.Executor, filter driver.QuarantineFilter, action, id string) error {
	filter.Limit = quarantinePage
	// pages calls fn with each page of the rows of filter, in seq order.
	pages := func(f driver.QuarantineFilter, fn func([]driver.QuarantinedRow) error) error {
		for {
			page, err := rd.ListQuarantined(ctx, ex, f)
			if err != nil {
				return err
			}
			if err := fn(page); err != nil {
				return err
			}
			if len(page) < f.Limit {
				return nil
			}
			f.AfterSeq = page[len(page)-1].Seq
		}
	}
	var c failgroup.Counter
	err := pages(filter, func(page []driver.QuarantinedRow) error {
		for _, r := range page {
			c.Add(failgroup.RelayScope, failgroup.RelayClass(r.LastError), r.LastError, r.QuarantinedAt, r.QuarantinedAt)
		}
		return nil
	})
	if err != nil {
		return err
	}
	groups := c.Groups()
	if action == "groups" {
		rows := make([]inbox.FailureGroup, len(groups))
		for i, g := range groups {
			rows[i] = inbox.FailureGroup{ID: g.ID, Consumer: g.Scope, Class: g.Class, Cause: g.Cause, Example: g.Example, Count: g.Count,
				FirstFailed: g.FirstSeen, LastFailed: g.LastSeen}
		}
		return printGroups(e.stdout, rows, q.flag("json") == "true", "No quarantined outbox row matches.", " --relay")
	}
	var g failgroup.Group
	for _, x := range groups {
		if x.ID == id {
			g = x
		}
	}
	if g.ID == "" {
		return fmt.Errorf("no quarantined outbox row of group %s matches (see \"idem failed groups --relay\")", id)
	}
	what := fmt.Sprintf("the %d quarantined outbox row(s) of group %s (%s: %s)", g.Count, g.ID, g.Class, textshow.OneLine(g.Cause, 100))
	question := "Requeue " + what + "?"
	if action == "remove" {
		question = "Remove " + what + " for good? Their events will never be published."
	}
	if q.flag("yes") != "true" && !confirm(e, question) {
		return errors.New("not confirmed; nothing changed (pass --yes to skip the question)")
	}
	done, gone := 0, 0
	err = pages(filter, func(page []driver.QuarantinedRow) error {
		verb := map[string]string{"retry": "Requeued", "remove": "Removed"}[action]
		for _, r := range page {
			if failgroup.ID(failgroup.RelayScope, failgroup.RelayClass(r.LastError), failgroup.Normalize(r.LastError)) != id {
				continue
			}
			var n int64
			var err error
			if action == "remove" {
				n, err = rd.DeleteQuarantined(ctx, ex, []int64{r.Seq})
			} else {
				n, err = rd.RequeueQuarantined(ctx, ex, []int64{r.Seq})
			}
			if err != nil {
				return err
			}
			if n == 0 {
				gone++
				fmt.Fprintf(e.stderr, "idem failed %s --relay: seq %d is no longer quarantined; left alone\n", action, r.Seq)
				continue
			}
			done++
			fmt.Fprintf(e.stdout, "%s seq %d (%s)\n", verb, r.Seq, rowSummary(r))
		}
		return nil
	})
	verb := map[string]string{"retry": "Requeued", "remove": "Removed"}[action]
	summary := fmt.Sprintf("%s %d quarantined outbox row(s) of group %s", verb, done, id)
	if gone > 0 {
		summary += fmt.Sprintf("; %d were no longer quarantined and were left alone", gone)
	}
	if action == "retry" {
		summary += ": the relay publishes them at its next claim, then the rows behind them"
	}
	fmt.Fprintln(e.stdout, summary+".")
	return err
}
