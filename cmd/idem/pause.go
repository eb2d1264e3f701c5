package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/textshow"
	"github.com/idem-go/idem/relay"
)

// pauseUsageCommon is the part of "idem help pause" and "idem help resume"
// about what a pause does.
const pauseUsageCommon = `
A pause is recorded in the database (table consumer_pause, migration 0015),
where every replica reads it: a consumer reads its own once per second
(inbox.Config.PauseCheck) and, while it holds, hands every message back to
its transport before any handler runs: no attempt is counted, nothing is
parked, the messages wait in the broker. A relay (idem relay, idem cdc) of
a paused outbox claims and publishes nothing and keeps its position: the
rows wait in the outbox, a log relay's position stays where it was
confirmed. Pauses hold through restarts; "idem status" and the dashboard
show them.`

// pauseCommand is "idem pause".
func pauseCommand() *command {
	return &command{
		name:    "pause",
		summary: "pause a consumer or a relay, at once or in a time window, on every replica",
		usage: `Usage:
  idem pause [--db URL] CONSUMER        [--until T | --for D] [--from T] [--reason TEXT] [--by NAME]
  idem pause [--db URL] --relay [OUTBOX] [--until T | --for D] [--from T] [--reason TEXT] [--by NAME]
  idem pause [--db URL] --list

pause records an operator's pause of the consumer named CONSUMER (its
inbox.Config.Name), or with --relay of the relays of the outbox table
OUTBOX (default outbox), replacing its pause if it has one. Without --until
or --for it lasts until "idem resume"; with them it ends by itself.
--from schedules it (a maintenance window). --list prints every pause,
active, scheduled or ended.
` + pauseUsageCommon + `

Times are RFC 3339 (2026-12-08T03:00:00+01:00), a date, or a duration
from now (90m).

Examples:
  idem pause shipping --reason "carrier maintenance" --from 2026-12-08T03:00:00Z --until 2026-12-08T05:00:00Z
  idem pause stock --for 30m --reason "stock service redeploy"
  idem pause --relay --reason "broker upgrade"
  idem pause --list`,
		setup: setupPause,
	}
}

// resumeCommand is "idem resume".
func resumeCommand() *command {
	return &command{
		name:    "resume",
		summary: "remove the pause of a consumer or a relay",
		usage: `Usage:
  idem resume [--db URL] CONSUMER
  idem resume [--db URL] --relay [OUTBOX]

resume removes the pause of the consumer named CONSUMER, or with --relay of
the relays of the outbox table OUTBOX (default outbox). Its replicas go on
within a second: a consumer's transport delivers again what waited, a relay
publishes from where it stopped.
` + pauseUsageCommon + `

Examples:
  idem resume shipping
  idem resume --relay`,
		setup: setupResume,
	}
}

// pauseOptions holds the flags of "idem pause" and "idem resume".
type pauseOptions struct {
	db     dbFlags
	resume bool
	relay  bool
	list   bool
	until  string
	dur    time.Duration
	from   string
	reason string
	by     string
}

func (o *pauseOptions) register(fs *flag.FlagSet) {
	o.db.register(fs)
	fs.BoolVar(&o.relay, "relay", false, "the relays of an outbox table (default outbox) instead of a consumer")
	if o.resume {
		return
	}
	fs.BoolVar(&o.list, "list", false, "print every pause instead")
	fs.StringVar(&o.until, "until", "", "end the pause by itself at this time")
	fs.DurationVar(&o.dur, "for", 0, "end the pause by itself after this long (from --from, else from now)")
	fs.StringVar(&o.from, "from", "", "begin the pause at this time instead of now")
	fs.StringVar(&o.reason, "reason", "", "why, for idem status and the dashboard (at most 1000 bytes)")
	fs.StringVar(&o.by, "by", "", "who pauses (default $USER)")
}

func setupPause(fs *flag.FlagSet) runFunc {
	o := &pauseOptions{}
	o.register(fs)
	return o.run
}

func setupResume(fs *flag.FlagSet) runFunc {
	o := &pauseOptions{resume: true}
	o.register(fs)
	return o.run
}

// pauseTime parses a time of --from or --until: a time, a date, or a
// duration from now.
func pauseTime(flagName, s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(d), nil
	}
	t, err := parseTime(flagName, s, now)
	if err != nil {
		return time.Time{}, usagef("--%s %q: want an RFC 3339 time (2026-12-08T03:00:00Z), a date (2026-12-08) or a duration from now (90m)", flagName, s)
	}
	return t, nil
}

// target returns what args name: a consumer, or with --relay an outbox.
func (o *pauseOptions) target(args []string) (idemmsg.PauseKind, string, error) {
	switch {
	case o.relay && len(args) == 0:
		return idemmsg.PauseRelay, idemmsg.OutboxTableDefault, nil
	case o.relay && len(args) == 1:
		return idemmsg.PauseRelay, args[0], nil
	case o.relay:
		return "", "", usagef("--relay takes at most one outbox table")
	case len(args) == 1:
		return idemmsg.PauseConsumer, args[0], nil
	case len(args) == 0:
		return "", "", usagef("name the consumer (its inbox.Config.Name), or give --relay for the relays of an outbox")
	}
	return "", "", usagef("one consumer at a time; got %d names", len(args))
}

// run runs "idem pause" or "idem resume" with the positional arguments
// args.
func (o *pauseOptions) run(ctx context.Context, e *env, args []string) error {
	now := time.Now()
	var p idemmsg.Pause
	if o.list {
		if len(args) > 0 || o.relay || o.until != "" || o.dur != 0 || o.from != "" || o.reason != "" {
			return usagef("--list takes no name nor pause flags")
		}
	} else if !o.resume {
		var err error
		if p.From, err = pauseTime("from", o.from, now); err != nil {
			return err
		}
		switch {
		case o.until != "" && o.dur != 0:
			return usagef("give --until or --for, not both")
		case o.dur < 0:
			return usagef("--for %v: want a positive duration", o.dur)
		case o.dur > 0:
			p.Until = now.Add(o.dur)
			if !p.From.IsZero() {
				p.Until = p.From.Add(o.dur)
			}
		case o.until != "":
			if p.Until, err = pauseTime("until", o.until, now); err != nil {
				return err
			}
		}
		if !p.Until.IsZero() && !p.Until.After(now) {
			return usagef("--until %s is not in the future", p.Until.Format(time.RFC3339))
		}
		p.Reason, p.By = o.reason, o.by
		if p.By == "" {
			p.By = e.getenv("USER")
		}
		if err := p.Validate(); err != nil {
			return usagef("%v", err)
		}
	}
	var kind idemmsg.PauseKind
	var name string
	if !o.list {
		var err error
		if kind, name, err = o.target(args); err != nil {
			return err
		}
	}

	conn, err := o.db.open(ctx, e)
	if err != nil {
		return err
	}
	defer conn.Close()
	consumers, relays := inbox.NewPauseStore(conn.SQL), relay.NewPauseStore(conn.SQL)
	switch {
	case o.list:
		return listPauses(ctx, e.stdout, consumers, relays, now)
	case o.resume:
		var ok bool
		if kind == idemmsg.PauseRelay {
			ok, err = relays.Resume(ctx, name)
		} else {
			ok, err = consumers.Resume(ctx, name)
		}
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintf(e.stdout, "the %s %s was not paused\n", kind, name)
			return nil
		}
		fmt.Fprintf(e.stdout, "resumed the %s %s: its replicas go on within a second\n", kind, name)
		return nil
	}
	if kind == idemmsg.PauseRelay {
		err = relays.Pause(ctx, name, p)
	} else {
		err = consumers.Pause(ctx, name, p)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "paused the %s %s %s; undo with: idem resume %s\n", kind, name, pauseWhen(p, now), resumeArgs(kind, name))
	return nil
}

// resumeArgs returns the arguments of "idem resume" for kind and name.
func resumeArgs(kind idemmsg.PauseKind, name string) string {
	if kind == idemmsg.PauseRelay {
		if name == idemmsg.OutboxTableDefault {
			return "--relay"
		}
		return "--relay " + name
	}
	return name
}

// pauseWhen says when p holds, seen at now.
func pauseWhen(p idemmsg.Pause, now time.Time) string {
	from := "from now (its replicas stop within a second)"
	if !p.From.IsZero() && p.From.After(now) {
		from = "from " + p.From.Local().Format(time.RFC3339)
	}
	if p.Until.IsZero() {
		return from + " until resumed"
	}
	return from + " until " + p.Until.Local().Format(time.RFC3339)
}

// pauseState names the state of p at now: active, scheduled or ended.
func pauseState(p idemmsg.Pause, now time.Time) string {
	switch {
	case p.ActiveAt(now):
		return "active"
	case p.EndedAt(now):
		return "ended"
	}
	return "scheduled"
}

// listPauses prints every pause of the database.
func listPauses(ctx context.Context, w io.Writer, consumers *inbox.PauseStore, relays *relay.PauseStore, now time.Time) error {
	cs, err := consumers.List(ctx)
	if err != nil {
		return err
	}
	rs, err := relays.List(ctx)
	if err != nil {
		return err
	}
	all := append(cs, rs...)
	if len(all) == 0 {
		fmt.Fprintln(w, "no pauses")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tSTATE\tFROM\tUNTIL\tBY\tREASON")
	for _, p := range all {
		from, until := "-", "-"
		if !p.From.IsZero() {
			from = p.From.Local().Format(time.RFC3339)
		}
		if !p.Until.IsZero() {
			until = p.Until.Local().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Kind, p.Name, pauseState(p, now), from, until, dash(pauseText(p.By, 100)), dash(pauseText(p.Reason, 200)))
	}
	return tw.Flush()
}

// dash returns s, or "-" when it is empty.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// pauseText returns an operator's text (a reason, a name) for a terminal:
// on one line, cut to n runes, quoted when it holds control characters.
func pauseText(s string, n int) string {
	if !textshow.IsText([]byte(s)) {
		return textshow.Printable([]byte(textshow.OneLine(s, n)))
	}
	return textshow.OneLine(s, n)
}
