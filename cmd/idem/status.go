package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/monitor"
)

// watchDefault is the refresh interval of a bare --watch.
const watchDefault = 2 * time.Second

// statusCommand is "idem status".
func statusCommand() *command {
	return &command{
		name:    "status",
		summary: "one screen of what to watch: outbox backlog, consumers' progress, parked messages, broker queues",
		usage: `Usage:
  idem status [--db URL ...] [--schema NAME,...] [--broker URL] [--consumer NAME ...] [--json] [--watch [INTERVAL]]
  idem status --dashboard URL [--json] [--watch [INTERVAL]]

Reads each database given with --db (default $IDEM_DB_URL) and prints:

  - its outbox: the backlog (rows not yet published, quarantined ones
    apart), how long the oldest of them has waited, when the relay last
    published, and how many rows it quarantined ("idem failed list --relay");
    with a "scheduled" line when delayed events (idem.Event.NotBefore) wait
    for their time: how many, and when the next one is due; and an
    "archive" line when the CDC relays keep what they published
    (outbox_archive): the period "idem replay" can cover;
  - one line per consumer found in its tables (processed_event,
    failed_message, delivery_attempt) or named with --consumer: when it last
    processed an event, how many it processed in the last minute, how many
    messages it parked ("idem failed list --consumer NAME") and since when,
    and how many events wait for a retry;
  - with --broker, what waits for each consumer in the broker: the messages
    ready in its queue and its consumers (RabbitMQ), the lag of its consumer
    group (Kafka), the pending and unacknowledged messages of its durable
    consumer (NATS JetStream). The broker is only read: nothing is declared;
  - the partitions of consumers shared by replicas (inbox.Group): each
    one's owner, its epoch (how many times it changed hands) and how long
    the owner's lease runs; with --broker, the messages waiting in the
    partition's queue or durable consumer.

Ages are measured on the database's clock. A database without an outbox
table (a consumer-only database) shows "no outbox table". Reading is
cheap: no statement reads all of processed_event (see docs/OPERATIONS.md).

--schema reads idem's tables in each of the named PostgreSQL schemas or
MySQL databases of every --db (the shop keeps one per service); SQLite has
one file per database: give each with --db.

--dashboard reads the same figures from a running dashboard ("idem
dashboard", or the /dashboard/ of a shop started with --admin-addr) instead
of the databases: one command for every database the dashboard watches,
with its broker's figures, even when the broker is embedded in that
process and cannot be reached from outside.

--json prints one JSON document per database and refresh, on one line:

  {"database": "...", "taken_at": "RFC 3339", "outbox": {"table", "present",
   "backlog", "quarantined", "scheduled", "next_due_at", "next_due_in_seconds",
   "oldest_unpublished_at", "oldest_unpublished_age_seconds",
   "last_published_at", "last_published_age_seconds", and when there are
   "log_position", "log_position_at", "archive_oldest_published_at",
   "archive_newest_published_at"}, "consumers": [{"name",
   "last_processed_at", "last_processed_age_seconds", "processed_last_minute",
   "parked", "oldest_parked_at", "oldest_parked_age_seconds", "retrying",
   "broker": {"queue", "ready", "unacked", "lag", "consumers"}}], "broker_error",
   "partitions": [{"consumer", "partition", "owner", "epoch", "live",
   "lease_left_seconds", "broker": {...}}]}

Times and ages are null when there is none (no row waiting, nothing
published...), and so are the broker's figures it cannot tell and "broker"
without --broker or when the broker does not know the consumer. Field names
are stable; new fields may be added.

--watch refreshes every INTERVAL (default 2s; --watch 5s or --watch=5s)
until interrupted (Ctrl-C or SIGTERM, exit status 0). A failed read is shown
and retried at the next refresh; a failure of the first read ends the
command (a wrong URL, tables missing: run "idem migrate up").

Examples:
  IDEM_DB_URL=postgres://app@localhost/app idem status
  IDEM_BROKER_URL=amqp://... idem status --db postgres://localhost/shop --schema shop_order,shop_stock,shop_shipping,shop_billing
  idem status --db sqlite:shop-data/shop_order.db --db sqlite:shop-data/shop_stock.db --watch
  idem status --db-file /run/secrets/stock-db-url --broker kafka://localhost:9092 --consumer stock --json | jq .consumers
  idem status --dashboard http://127.0.0.1:9464/dashboard/ --watch
  idem status --dashboard http://10.0.0.5:9464/dashboard/ --auth-token-file /run/secrets/admin-token`,
		setup: setupStatus,
	}
}

// statusOptions holds the flags of "idem status".
type statusOptions struct {
	dbs       listFlag
	schemas   listFlag
	consumers listFlag
	br        brokerFlags
	watch     watchFlag
	prefix    string
	dashboard string
	tokenFile string
	asJSON    bool
}

// setupStatus declares the flags of "idem status" on fs and returns the
// function that runs the command.
func setupStatus(fs *flag.FlagSet) runFunc {
	o := &statusOptions{}
	fs.Var(&o.dbs, "db", "database URL, repeatable (default $IDEM_DB_URL):\n"+registry.DatabaseURLHelp())
	envflag.FileFlag(fs, "db")
	fs.Var(&o.schemas, "schema", "schemas (PostgreSQL) or databases (MySQL) holding idem's tables, comma-separated or repeated (default $IDEM_SCHEMA, else the connection's)")
	fs.Var(&o.consumers, "consumer", "a consumer to report on besides those found in the tables (one that processed nothing yet), repeatable")
	o.br.register(fs)
	fs.StringVar(&o.prefix, "prefix", "", "prefix of the broker's names, as the consumers subscribed with (queues <prefix>.<consumer>.events, groups <prefix>.<consumer>)")
	fs.StringVar(&o.dashboard, "dashboard", "", "read the status from the running dashboard at this URL (idem dashboard, a shop's http://ADMIN-ADDR/dashboard/) instead of the databases")
	fs.StringVar(&o.tokenFile, "auth-token-file", "", "with --dashboard: file holding the dashboard's bearer token (default $"+dashboardTokenEnv+")")
	fs.BoolVar(&o.asJSON, "json", false, "print one JSON document per database and refresh, for scripts")
	fs.Var(&o.watch, "watch", "refresh every INTERVAL until interrupted (default 2s when given without a value)")
	return o.run
}

// run runs "idem status" with the positional arguments args.
func (o *statusOptions) run(ctx context.Context, e *env, args []string) error {
	if o.watch.on && len(args) > 0 {
		// "--watch 5s": the flag package gives a boolean flag no value.
		d, err := time.ParseDuration(args[0])
		if err != nil {
			return usagef("unexpected argument %q (--watch INTERVAL takes a duration such as 5s)", args[0])
		}
		if err := o.watch.Set(d.String()); err != nil {
			return err
		}
		args = args[1:]
	}
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	st := &statusCmd{e: e, json: o.asJSON}
	if o.dashboard != "" {
		if len(o.dbs) > 0 || len(o.schemas) > 0 || len(o.consumers) > 0 || o.br.URL != "" || o.prefix != "" {
			return usagef("--dashboard reads what the dashboard watches: give it without --db, --schema, --consumer, --broker and --prefix")
		}
		r, err := newRemoteStatus(o.dashboard)
		if err != nil {
			return usagef("--dashboard %s: %v", o.dashboard, err)
		}
		r.token = e.getenv(dashboardTokenEnv)
		if o.tokenFile != "" {
			if r.token, err = envflag.ReadFile(o.tokenFile); err != nil {
				return usagef("--auth-token-file: %v", err)
			}
		}
		st.remote = r
	} else if o.tokenFile != "" {
		return usagef("--auth-token-file is the token of --dashboard: give it with --dashboard only")
	} else if err := st.open(ctx, o.dbs, o.schemas, o.consumers, o.br.URL, o.prefix); err != nil {
		st.close()
		return err
	}
	defer st.close()
	if !o.watch.on {
		return st.once(ctx)
	}
	return st.watch(ctx, o.watch.every)
}

// listFlag is a repeatable flag whose values may also be comma-separated.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// watchFlag is --watch, with an optional interval.
type watchFlag struct {
	on    bool
	every time.Duration
}

func (w *watchFlag) String() string {
	if w == nil || !w.on {
		return ""
	}
	return w.every.String()
}

func (w *watchFlag) Set(v string) error {
	w.on = true
	if v == "" || v == "true" {
		w.every = watchDefault
		return nil
	}
	if v == "false" {
		w.on = false
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 100*time.Millisecond {
		return fmt.Errorf("want a duration of at least 100ms, such as 5s")
	}
	w.every = d
	return nil
}

func (w *watchFlag) IsBoolFlag() bool { return true }

// statusCmd is one run of "idem status".
type statusCmd struct {
	e       *env
	json    bool
	sources []*monitor.Source
	remote  *remoteStatus // with --dashboard, instead of sources
	closers []func()
}

func (s *statusCmd) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// open opens every database (each schema of each) and the broker.
func (s *statusCmd) open(ctx context.Context, dbs, schemas, consumers []string, brokerURL, prefix string) error {
	if len(dbs) == 0 {
		dbs = []string{s.e.getenv("IDEM_DB_URL")}
	}
	if len(schemas) == 0 {
		if v := s.e.getenv("IDEM_SCHEMA"); v != "" {
			schemas = []string{v}
		} else {
			schemas = []string{""}
		}
	}
	if brokerURL == "" {
		brokerURL = s.e.getenv("IDEM_BROKER_URL")
	}
	var ins broker.Inspector
	if brokerURL != "" {
		i, err := registry.OpenInspector(ctx, brokerURL, prefix)
		if err != nil {
			return err
		}
		s.closers = append(s.closers, func() { _ = i.Close() })
		ins = i
	}
	for _, u := range dbs {
		if path := sqliteFile(u); path != "" {
			// Opening a SQLite file that does not exist would create it.
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("database %s: %w (give the file of a database idem migrated)", u, err)
			}
		}
		for _, schema := range schemas {
			conn, err := registry.OpenDatabase(ctx, u, registry.DatabaseOptions{Tables: idemmsg.Tables{Schema: schema}, MaxConns: 2})
			if err != nil {
				return err
			}
			s.closers = append(s.closers, conn.Close)
			name := conn.Redacted()
			if schema != "" {
				name += " schema " + schema
			}
			s.sources = append(s.sources, monitor.New(conn.SQL, monitor.Options{Name: name, Broker: ins, Consumers: consumers}))
		}
	}
	return nil
}

// sqliteFile returns the file a sqlite: URL names, or "" for other URLs.
func sqliteFile(u string) string {
	scheme, _, ok := strings.Cut(u, ":")
	if !ok || (!strings.EqualFold(scheme, "sqlite") && !strings.EqualFold(scheme, "file")) {
		return ""
	}
	path, _, _ := strings.Cut(strings.TrimPrefix(registry.SQLitePath(u), "file:"), "?")
	return path
}

// snapshots reads every source; the error of a source is returned with the
// snapshots read before it.
func (s *statusCmd) snapshots(ctx context.Context) ([]monitor.Snapshot, error) {
	if s.remote != nil {
		return s.remote.snapshots(ctx)
	}
	out := make([]monitor.Snapshot, 0, len(s.sources))
	for _, src := range s.sources {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		snap, err := src.Snapshot(rctx)
		cancel()
		if err != nil {
			return out, err
		}
		out = append(out, snap)
	}
	return out, nil
}

func (s *statusCmd) once(ctx context.Context) error {
	snaps, err := s.snapshots(ctx)
	if err != nil {
		return statusErr(err)
	}
	return s.print(s.e.stdout, snaps)
}

// statusErr adds what to do to a missing table.
func statusErr(err error) error {
	if errors.Is(err, idemmsg.ErrMissingTable) {
		return fmt.Errorf("%w\nidem status reads the tables \"idem migrate up\" creates (outbox, processed_event, failed_message, delivery_attempt)", err)
	}
	return err
}

// watch prints a snapshot every interval until ctx ends.
func (s *statusCmd) watch(ctx context.Context, every time.Duration) error {
	f, _ := s.e.stdout.(*os.File)
	clear := !s.json && f != nil && isTerminal(f)
	first := true
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		snaps, err := s.snapshots(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && first {
			return statusErr(err)
		}
		first = false
		switch {
		case s.json:
			if perr := s.print(s.e.stdout, snaps); perr != nil {
				return perr
			}
			if err != nil {
				fmt.Fprintf(s.e.stderr, "idem status: %v (retrying in %v)\n", err, every)
			}
		default:
			var b strings.Builder
			if clear {
				b.WriteString("\033[H\033[2J")
			} else {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "Every %v, until interrupted. %s\n\n", every, time.Now().UTC().Format("2006-01-02 15:04:05 MST"))
			if perr := s.print(&b, snaps); perr != nil {
				return perr
			}
			if err != nil {
				fmt.Fprintf(&b, "\nerror: %v (retrying in %v)\n", err, every)
			}
			if _, err := io.WriteString(s.e.stdout, b.String()); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (s *statusCmd) print(w io.Writer, snaps []monitor.Snapshot) error {
	if s.json {
		enc := json.NewEncoder(w)
		for _, snap := range snaps {
			if err := enc.Encode(statusJSON(snap)); err != nil {
				return err
			}
		}
		return nil
	}
	for i, snap := range snaps {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if err := printSnapshot(w, snap); err != nil {
			return err
		}
	}
	return nil
}

// printSnapshot prints one database's screen.
func printSnapshot(w io.Writer, snap monitor.Snapshot) error {
	now := snap.Taken
	fmt.Fprintf(w, "%s  (at %s)\n", snap.Database, now.UTC().Format("2006-01-02 15:04:05 MST"))
	o := snap.Outbox
	table := "outbox"
	if o.Table != "outbox" {
		table += " " + o.Table
	}
	switch {
	case !o.Present:
		fmt.Fprintf(w, "  %s: no outbox table (a consumer-only database)\n", table)
	case o.Backlog > 0:
		fmt.Fprintf(w, "  %s: backlog %d, the oldest waiting for %s; last publish %s; quarantined %d\n",
			table, o.Backlog, humanDuration(snap.OldestUnpublishedAge()), ago(now, o.LastPublished, "never"), o.Quarantined)
	default:
		fmt.Fprintf(w, "  %s: backlog 0; last publish %s; quarantined %d\n", table, ago(now, o.LastPublished, "never"), o.Quarantined)
	}
	if o.Scheduled > 0 {
		fmt.Fprintf(w, "  scheduled: %d delayed, the next due in %s (%s)\n", o.Scheduled,
			humanDuration(max(o.NextDue.Sub(now), 0)), o.NextDue.UTC().Format("2006-01-02 15:04:05 MST"))
	}
	if o.LogPosition != "" {
		fmt.Fprintf(w, "  binlog relay: position %s, stored %s\n", o.LogPosition, ago(now, o.LogPositionAt, "never"))
	}
	if !o.ArchiveOldest.IsZero() {
		fmt.Fprintf(w, "  archive: events published from %s to %s (idem replay covers that period)\n",
			ago(now, o.ArchiveOldest, "-"), ago(now, o.ArchiveNewest, "-"))
	}
	if snap.BrokerError != "" {
		fmt.Fprintf(w, "  broker: %s\n", snap.BrokerError)
	}
	for _, p := range snap.Pauses {
		fmt.Fprintf(w, "  %s\n", pauseLine(p, now))
	}
	if len(snap.Consumers) == 0 {
		fmt.Fprintln(w, "  consumers: none has processed, parked or retried anything here yet")
		return nil
	}
	withBroker := snap.Queues != nil || snap.BrokerError != ""
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "  CONSUMER\tLAST PROCESSED\tPER MIN\tPARKED\tOLDEST PARKED\tRETRYING"
	if withBroker {
		header += "\tQUEUE\tREADY\tUNACKED\tLAG\tCONSUMERS"
	}
	fmt.Fprintln(tw, header)
	for _, c := range snap.Consumers {
		line := fmt.Sprintf("  %s\t%s\t%d\t%d\t%s\t%d", c.Name, ago(now, c.LastProcessed, "never"), c.ProcessedLastMinute,
			c.Parked, ago(now, c.OldestParked, "-"), c.Retrying)
		if withBroker {
			if q, ok := snap.Queue(c.Name); ok {
				line += fmt.Sprintf("\t%s\t%s\t%s\t%s\t%s", q.Queue, figure(q.Ready), figure(q.Unacked), figure(q.Lag), figure(q.Consumers))
			} else {
				line += "\t(unknown to the broker)"
			}
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printPartitions(w, snap, withBroker)
}

// printPartitions prints the partitions of the consumers' ownership groups
// (inbox.Group), when there are any: owner, epoch, lease, and with a
// broker the messages waiting in the partition's queue.
func printPartitions(w io.Writer, snap monitor.Snapshot, withBroker bool) error {
	if len(snap.Partitions) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "  CONSUMER\tPARTITION\tOWNER\tEPOCH\tLEASE"
	if withBroker {
		header += "\tQUEUE\tWAITING"
	}
	fmt.Fprintln(tw, header)
	for _, p := range snap.Partitions {
		owner, lease := p.Owner, "free"
		switch {
		case p.Owner == "":
			owner = "-"
		case p.Live():
			lease = humanDuration(p.LeaseLeft) + " left"
		default:
			lease = "expired " + humanDuration(-p.LeaseLeft) + " ago"
		}
		line := fmt.Sprintf("  %s\t%d\t%s\t%d\t%s", p.Consumer, p.Partition, owner, p.Epoch, lease)
		if withBroker {
			if p.Queue != nil {
				line += fmt.Sprintf("\t%s\t%s", p.Queue.Queue, figure(p.Queue.Waiting()))
			} else {
				line += "\t-\t-"
			}
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// figure prints a broker figure, "-" when the transport cannot tell it.
func figure(n int64) string {
	if n < 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

// ago prints how long before now t was, or none when t is zero.
func ago(now, t time.Time, none string) string {
	if t.IsZero() {
		return none
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	return humanDuration(d) + " ago"
}

// humanDuration prints d with two units at most: 850ms, 42s, 3m20s, 5h02m,
// 3d04h.
func humanDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int64(d/time.Minute), int64(d%time.Minute/time.Second))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int64(d/time.Hour), int64(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%02dh", int64(d/(24*time.Hour)), int64(d%(24*time.Hour)/time.Hour))
}

// The JSON document of --json; its field names are stable (documented in
// the command's help and docs/OPERATIONS.md).
type (
	statusDoc struct {
		Database    string        `json:"database"`
		TakenAt     time.Time     `json:"taken_at"`
		Outbox      outboxDoc     `json:"outbox"`
		Consumers   []consumerDoc `json:"consumers"`
		BrokerError string        `json:"broker_error,omitempty"`
		// Partitions are those of the consumers' ownership groups; absent
		// when no group ran on the database.
		Partitions []partitionDoc `json:"partitions,omitempty"`
		// Pauses are the operators' pauses in force or scheduled.
		Pauses []pauseDoc `json:"pauses,omitempty"`
	}
	partitionDoc struct {
		Consumer   string    `json:"consumer"`
		Partition  int       `json:"partition"`
		Owner      *string   `json:"owner"`
		Epoch      int64     `json:"epoch"`
		Live       bool      `json:"live"`
		LeaseLeftS *float64  `json:"lease_left_seconds"`
		Broker     *queueDoc `json:"broker"`
	}
	outboxDoc struct {
		Table                 string     `json:"table"`
		Present               bool       `json:"present"`
		Backlog               int64      `json:"backlog"`
		Quarantined           int64      `json:"quarantined"`
		Scheduled             int64      `json:"scheduled"`
		NextDueAt             *time.Time `json:"next_due_at"`
		NextDueInS            *float64   `json:"next_due_in_seconds"`
		OldestUnpublishedAt   *time.Time `json:"oldest_unpublished_at"`
		OldestUnpublishedAgeS *float64   `json:"oldest_unpublished_age_seconds"`
		LastPublishedAt       *time.Time `json:"last_published_at"`
		LastPublishedAgeS     *float64   `json:"last_published_age_seconds"`
		LogPosition           string     `json:"log_position,omitempty"`
		LogPositionAt         *time.Time `json:"log_position_at,omitempty"`
		ArchiveOldestAt       *time.Time `json:"archive_oldest_published_at,omitempty"`
		ArchiveNewestAt       *time.Time `json:"archive_newest_published_at,omitempty"`
	}
	consumerDoc struct {
		Name                string     `json:"name"`
		LastProcessedAt     *time.Time `json:"last_processed_at"`
		LastProcessedAgeS   *float64   `json:"last_processed_age_seconds"`
		ProcessedLastMinute int64      `json:"processed_last_minute"`
		Parked              int64      `json:"parked"`
		OldestParkedAt      *time.Time `json:"oldest_parked_at"`
		OldestParkedAgeS    *float64   `json:"oldest_parked_age_seconds"`
		Retrying            int64      `json:"retrying"`
		Broker              *queueDoc  `json:"broker"`
	}
	pauseDoc struct {
		Kind    string     `json:"kind"`
		Name    string     `json:"name"`
		Active  bool       `json:"active"`
		From    *time.Time `json:"from"`
		Until   *time.Time `json:"until"`
		Reason  string     `json:"reason"`
		By      string     `json:"by"`
		AddedAt time.Time  `json:"paused_at"`
	}
	queueDoc struct {
		Queue     string `json:"queue"`
		Ready     *int64 `json:"ready"`
		Unacked   *int64 `json:"unacked"`
		Lag       *int64 `json:"lag"`
		Consumers *int64 `json:"consumers"`
	}
)

func statusJSON(snap monitor.Snapshot) statusDoc {
	now := snap.Taken
	at := func(t time.Time) (*time.Time, *float64) {
		if t.IsZero() {
			return nil, nil
		}
		u := t.UTC()
		age := max(now.Sub(t), 0).Seconds()
		return &u, &age
	}
	known := func(n int64) *int64 {
		if n < 0 {
			return nil
		}
		return &n
	}
	doc := statusDoc{Database: snap.Database, TakenAt: now.UTC(), BrokerError: snap.BrokerError, Consumers: []consumerDoc{}}
	o := snap.Outbox
	doc.Outbox = outboxDoc{Table: o.Table, Present: o.Present, Backlog: o.Backlog, Quarantined: o.Quarantined, Scheduled: o.Scheduled}
	if !o.NextDue.IsZero() {
		u, in := o.NextDue.UTC(), max(o.NextDue.Sub(now), 0).Seconds()
		doc.Outbox.NextDueAt, doc.Outbox.NextDueInS = &u, &in
	}
	doc.Outbox.OldestUnpublishedAt, doc.Outbox.OldestUnpublishedAgeS = at(o.OldestUnpublished)
	doc.Outbox.LastPublishedAt, doc.Outbox.LastPublishedAgeS = at(o.LastPublished)
	doc.Outbox.LogPosition = o.LogPosition
	doc.Outbox.LogPositionAt, _ = at(o.LogPositionAt)
	doc.Outbox.ArchiveOldestAt, _ = at(o.ArchiveOldest)
	doc.Outbox.ArchiveNewestAt, _ = at(o.ArchiveNewest)
	for _, c := range snap.Consumers {
		cd := consumerDoc{Name: c.Name, ProcessedLastMinute: c.ProcessedLastMinute, Parked: c.Parked, Retrying: c.Retrying}
		cd.LastProcessedAt, cd.LastProcessedAgeS = at(c.LastProcessed)
		cd.OldestParkedAt, cd.OldestParkedAgeS = at(c.OldestParked)
		if q, ok := snap.Queue(c.Name); ok {
			cd.Broker = &queueDoc{Queue: q.Queue, Ready: known(q.Ready), Unacked: known(q.Unacked), Lag: known(q.Lag), Consumers: known(q.Consumers)}
		}
		doc.Consumers = append(doc.Consumers, cd)
	}
	for _, p := range snap.Pauses {
		pd := pauseDoc{Kind: string(p.Kind), Name: p.Name, Active: p.ActiveAt(now), Reason: p.Reason, By: p.By, AddedAt: p.At.UTC()}
		pd.From, _ = at(p.From)
		pd.Until, _ = at(p.Until)
		doc.Pauses = append(doc.Pauses, pd)
	}
	for _, p := range snap.Partitions {
		pd := partitionDoc{Consumer: p.Consumer, Partition: p.Partition, Epoch: p.Epoch, Live: p.Live()}
		if p.Owner != "" {
			owner, left := p.Owner, p.LeaseLeft.Seconds()
			pd.Owner, pd.LeaseLeftS = &owner, &left
		}
		if q := p.Queue; q != nil {
			pd.Broker = &queueDoc{Queue: q.Queue, Ready: known(q.Ready), Unacked: known(q.Unacked), Lag: known(q.Lag), Consumers: known(q.Consumers)}
		}
		doc.Partitions = append(doc.Partitions, pd)
	}
	return doc
}

// pauseLine says what p pauses and until when, seen at now, on one line.
func pauseLine(p idemmsg.Pause, now time.Time) string {
	line := fmt.Sprintf("paused %s %s: %s", p.Kind, p.Name, pauseState(p, now))
	if !p.From.IsZero() && p.From.After(now) {
		line += ", from " + p.From.UTC().Format("2006-01-02 15:04:05 MST")
	}
	if p.Until.IsZero() {
		line += ", until resumed"
	} else {
		line += ", until " + p.Until.UTC().Format("2006-01-02 15:04:05 MST")
	}
	if p.By != "" {
		line += ", by " + pauseText(p.By, 100)
	}
	if p.Reason != "" {
		line += " (" + pauseText(p.Reason, 200) + ")"
	}
	return line + "; idem resume " + resumeArgs(p.Kind, p.Name)
}
