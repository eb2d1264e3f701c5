package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/internal/telemetry"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/binlog"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/cdc/cdcmetrics"
	"github.com/idem-go/idem/relay/logrelay"
)

// cdcServiceName is the default service name of the CDC relays' spans.
const cdcServiceName = "idem-cdc"

// cdcCommand is "idem cdc".
func cdcCommand() *command {
	return &command{
		name:    "cdc",
		summary: "publish the outbox read from PostgreSQL's write-ahead log or MariaDB's or MySQL's binary log (runs until SIGTERM)",
		usage: `Usage:
  idem cdc [--db URL] [--broker URL] [--schema S] [--table T] [--slot NAME] [flags]
  idem cdc drop-slot [--db URL] [--schema S] [--table T] [--slot NAME]
  idem cdc --db mysql://... [--broker URL] [--table T] [--server-id N] [flags]
  idem cdc reset-position --db mysql://... [--table T]

Runs the change-data-capture relay: it reads the inserts into the outbox
table, and the events written as WAL messages (outbox.NewLogWriter), from a
logical replication slot (pgoutput, built into PostgreSQL), publishes them in
commit order with broker confirms, and confirms the slot's position only once
the broker has confirmed everything before it. No claim, no mark, no NOTIFY
trigger needed: the table's insert is the only write per event, or with WAL
messages no row at all. Events of one aggregate are published in order; after
a crash the slot gives again what was not confirmed (consumers deduplicate).

The server must run with wal_level = logical (in postgresql.conf, then
restart; the command says so when it does not), and the relay's role needs
the REPLICATION attribute (ALTER ROLE app REPLICATION) and a pg_hba.conf line
that lets it connect to the database. At start the relay creates, when they
do not exist, the publication (for inserts into the outbox; this needs the
ownership of the table, as "idem migrate" has: otherwise the error gives the
CREATE PUBLICATION statement for its owner) and the slot, named
idem_<schema>_<table> (schema "public" unless --schema is given).

One relay reads a slot at a time: start a second one on the same slot and it
waits, then takes over within a second or two when the first stops or dies.

Retention. By default each published row is deleted once confirmed, before
its position is confirmed to the server, so the table stays small. With
--keep-rows rows are left alone: the writer deletes them itself, often in
the same transaction as the insert (Debezium's "insert then delete": the
insert is in the log either way), or a job of its own does. Kept rows are
not marked published: "idem replay" reads the archive (below), not them.
Updates and deletes in the stream are never published.

Archive. Since this relay leaves no published row in the outbox (and a WAL
message is no row at all), it keeps the events it publishes in the table
outbox_archive (migration 0013) for --archive-retention (168h, 7 days, by
default, as the polling relay's --retention), so that "idem replay" can
publish a period again: each confirmed batch is archived in the statement
(PostgreSQL) or transaction (MariaDB) that deletes its rows, before its
position is confirmed, and the relay deletes what it archived longer ago
than the retention every minute. It costs one more insert per event in the
relay's database. --archive-retention 0 turns it off: then nothing this relay
published can be replayed. Keep the consumers' processed_event markers at
least as long as the retention ("idem purge --replay-window").

Delayed events (idem.Event.NotBefore) wait in the table: the stream skips
their inserts, and the relay publishes them from the table once due (it
looks every --due-interval), then deletes them (--keep-rows: sets their
published_at). A relay killed meanwhile loses none of them.

The slot keeps WAL. A slot holds the server's WAL from its confirmed
position on, even while no relay reads it: a relay stopped for a day keeps a
day of WAL on the server's disk. Bound it with max_slot_wal_keep_size in
postgresql.conf (the slot is invalidated past it: events are then lost to
this relay, so set it above the longest stop you accept), watch
idem_cdc_slot_retained_bytes, and the relay logs a warning when the slot
holds more than --lag-warn. When you retire a relay, drop its slot:

  idem cdc drop-slot --db postgres://app@db/shop --schema shop

(DROP PUBLICATION <slot name> removes the publication too.)

WAL messages are seen by every slot of the database, so each outbox has a
prefix of its own: idem.outbox:<schema>.<table> by default, the default of
outbox.NewLogWriter for the same tables. A writer given another prefix needs
the same --prefix here.

An id that is not a UUID (1 to 64 bytes of text) is published under the UUID
idem.EventID derives from it, with the id in the header idem-original-id, as
the polling relay does. A row that cannot become a message (an empty id or
one over 64 bytes, headers that are not a JSON object, no event name...) is
quarantined in the table, as the polling relay does ("idem failed list
--relay" shows it), and the relay goes on; fix it and insert it again to publish it. A WAL message that cannot
become a message is kept as a quarantined row whose last_error holds its
content ("idem failed show --relay SEQ").

A message the broker refuses (unroutable, nacked, too large) is retried with
backoff, its aggregate waiting, and quarantined after --quarantine-after
refusals: its row gets quarantined_at and last_error, and a WAL message is
written into the outbox as a quarantined row, so that one message no broker
takes does not hold the slot, and the server's WAL, for good. "idem failed
list|show --relay" shows them, "idem failed retry --relay" writes them again
and this relay publishes them, "idem failed remove --relay" drops them. A
broker that does not answer at all is retried for as long as it takes, and
quarantines nothing. With --failure-events, each quarantine also writes a
notice (event idem.failure.outbox_row.quarantined.v1: the row's table and
seq, class, group, error, event id and aggregate, not its payload) into the
outbox in the quarantine's transaction, which the relay then reads and
publishes to whoever subscribes to idem.failure.#.

It serves, at --metrics-addr (127.0.0.1:9465: loopback only), Prometheus
metrics on /metrics (idem_cdc_*: slot lag in bytes and seconds, retained WAL,
publish rate, publish and confirm delays; see docs/OPERATIONS.md), a health
check on /healthz (200 "ok" while it reads the slot or waits for it as a
standby, 503 "not ok" otherwise) and, with --pprof, the Go profiles on
/debug/pprof/. Beyond loopback the address needs a bearer token
(--auth-token-file FILE or IDEM_METRICS_TOKEN) or --insecure-no-auth, as
idem relay's (idem help relay).

Give URLs with passwords in IDEM_DB_URL and IDEM_BROKER_URL, or in files
(--db-file, --broker-file), not on the command line.

Failover. Before PostgreSQL 17 a standby has no copy of the logical slot.
Give --db every host with target_session_attrs=read-write and a
connect_timeout
(postgres://h1:5432,h2:5432/shop?target_session_attrs=read-write&connect_timeout=5): after a
promotion the relay finds its slot missing on the new primary, creates it
again and publishes the rows still in the outbox table (some again;
consumers deduplicate). Events that exist only in the WAL (WAL messages,
rows deleted by their writer or kept with --keep-rows) and were not
published are lost with the slot, so on a server with a physical standby
the relay refuses to start unless --rows-only says every event is a row it
deletes, or --accept-failover-loss accepts that loss. From PostgreSQL 17 on
the slot is created with failover (synchronized to standbys with
sync_replication_slots = on), and neither flag is needed.

MariaDB and MySQL. With a mysql:// URL the relay reads MariaDB's binary log
(10.5 or later), or MySQL's (8.0 or later, by GTID: gtid_mode = ON and
enforce_gtid_consistency = ON; docs/OPERATIONS.md, "MySQL 8"), as a replica
does.
Of MariaDB's defaults two must change, in the [mysqld] section of the
server's configuration:

  log_bin = mariadb-bin        # the binary log, on (off by default)
  binlog_format = ROW          # rows: MIXED, the default, logs plain inserts
                               # as statements, which hold no row to read

The other defaults work: server_id = 1 (--server-id must differ),
binlog_row_image = FULL (whole rows), log_bin_compress = OFF. With
binlog_row_metadata = NO_LOG, the default, the relay reads the column names
from information_schema, again after each ALTER TABLE of the outbox it reads
in the binlog; rows logged before an ALTER TABLE made while the relay was
stopped cannot be named then: it publishes the rows waiting in an idem
outbox from the table instead, and stops on another table, saying what to
do. binlog_row_metadata = FULL puts the names in the binlog and avoids both.
The relay's user needs GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.*
(plus SELECT, INSERT, UPDATE, DELETE on the outbox and its position table),
with mysql_native_password or (MySQL) caching_sha2_password. The command
checks each and says which is missing. TLS: the URL's sslmode, sslrootcert, sslcert and sslkey serve both
the SQL and the replication connections (docs/OPERATIONS.md, "TLS").
"idem migrate" creates the table binlog_position, where the relay stores
its position (a GTID position) once the broker confirmed
everything before it (and the published rows are deleted): a restart resumes
there; a crash publishes again what came after it (consumers deduplicate).
At the first start (no position stored) the relay publishes the rows waiting
in the outbox, in order, then reads the binlog from there. One relay reads
an outbox at a time (a named lock): a second waits and takes over when the
first stops or dies. An id that is not a UUID is published under its derived
UUID, as everywhere. Transactions are published once committed (a locking
read of one of their rows waits for it). The server keeps its binlog for
binlog_expire_logs_seconds (or expire_logs_days) whether or not the relay
reads it: a relay stopped for longer than that cannot resume ("the stored
position is no longer in the server's binlog"); then run

  idem cdc reset-position --db mysql://app@db/shop

and start it again: it publishes the rows still waiting in the outbox, and
reads on from the server's current position (events whose rows their writer
deleted meanwhile are lost). Metrics are the same idem_cdc_* (label slot:
binlog_<database>_<table>); slot_lag_bytes is the binlog written after what
the relay read.

On SIGTERM or SIGINT the relay stops reading, waits for the messages handed to
the broker (up to --stop-timeout), confirms the position and exits.

With tracing on (OTEL_* variables below), each published message has a
producer span, child of the span whose trace context the row's (or the WAL
message's) headers carry, so one trace runs from the request that wrote the
event through the relay to every consumer.

Examples:
  IDEM_DB_URL=postgres://app@localhost/shop IDEM_BROKER_URL=amqp://localhost/ idem cdc
  idem cdc --schema order --window 2000 --metrics-addr :9465 --auth-token-file /run/secrets/metrics-token
  idem cdc drop-slot --schema order
  idem cdc --db-file /run/secrets/relay-db-url --broker amqp://localhost/   # the file holds the mysql:// URL and its password
  OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 idem cdc

` + fmt.Sprintf(telemetry.Help, cdcServiceName),
		setup: setupCdc,
	}
}

// cdcOptions holds the flags of "idem cdc".
type cdcOptions struct {
	db              dbFlags
	br              brokerFlags
	table           string
	slot            string
	publication     string
	prefix          string
	window          int
	batch           int
	keepRows        bool
	rowsOnly        bool
	acceptLoss      bool
	quarantineAfter int
	failureEvents   bool
	serverID        uint
	lagWarn         int64
	archive         string
	ops             opsFlags
	stopTimeout     time.Duration
	dueInterval     time.Duration
	logFormat       string
	logLevel        string
}

// setupCdc declares the flags of "idem cdc" on fs and returns the
// function that runs the command.
func setupCdc(fs *flag.FlagSet) runFunc {
	o := &cdcOptions{}
	o.db.register(fs)
	o.br.register(fs)
	fs.StringVar(&o.table, "table", idemmsg.OutboxTableDefault, "outbox table")
	fs.StringVar(&o.slot, "slot", "", "replication slot (default idem_<schema>_<table>)")
	fs.StringVar(&o.publication, "publication", "", "publication (default: the slot's name)")
	fs.StringVar(&o.prefix, "prefix", "", "prefix of the WAL messages to publish (default idem.outbox:<schema>.<table>, the default of outbox.NewLogWriter)")
	fs.IntVar(&o.window, "window", logrelay.WindowDefault, "messages handed to the broker and not yet confirmed")
	fs.IntVar(&o.batch, "batch-size", logrelay.BatchSizeDefault, "maximum messages per publish call")
	fs.BoolVar(&o.keepRows, "keep-rows", false, "leave published rows in the table (the writer deletes them)")
	fs.BoolVar(&o.rowsOnly, "rows-only", false, "every event is a row the relay deletes (no WAL messages): lets the relay run on a server with a physical standby, and recover after a failover by publishing the rows still in the table")
	fs.BoolVar(&o.acceptLoss, "accept-failover-loss", false, "start on a server with a physical standby though a failover loses the events existing only in the WAL (WAL messages, rows deleted by their writer) not yet published")
	fs.IntVar(&o.quarantineAfter, "quarantine-after", logrelay.QuarantineAfterDefault, "quarantine a message the broker refused on this many attempts (negative: retry forever)")
	fs.BoolVar(&o.failureEvents, "failure-events", false, "write a notice of each row or message quarantined into the outbox (idem.failure.outbox_row.quarantined.v1), which the relay publishes")
	fs.UintVar(&o.serverID, "server-id", 0, "MariaDB and MySQL: the server_id the relay presents as a replica; must differ from every server's (default: derived from the database and table, in [2^30, 2^31))")
	fs.Int64Var(&o.lagWarn, "lag-warn", cdc.LagWarnBytesDefault, "warn when the slot retains more WAL than this many bytes (negative: never)")
	fs.StringVar(&o.archive, "archive-retention", "168h", "how long the archive keeps the events published, for idem replay (h, m, s or d: 168h, 30d); 0 turns the archive off")
	o.ops.register(fs, "127.0.0.1:9465")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 30*time.Second, "on SIGTERM, how long the messages in flight may take to be confirmed")
	fs.DurationVar(&o.dueInterval, "due-interval", logrelay.DueIntervalDefault, "how often the relay looks in the table for delayed rows (idem.Event.NotBefore) that fell due")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return o.run
}

// run runs "idem cdc" with the positional arguments args.
func (o *cdcOptions) run(ctx context.Context, e *env, args []string) error {
	sub := ""
	if len(args) == 1 && (args[0] == "drop-slot" || args[0] == "reset-position") {
		sub = args[0]
	} else if len(args) != 0 {
		return usagef("unexpected arguments %q (the subcommands are drop-slot and reset-position)", args)
	}
	dropSlot := sub == "drop-slot"
	dbURL, schema := o.db.Resolve(e.getenv)
	if dbURL == "" {
		return usagef("--db is required (or IDEM_DB_URL): a postgres:// URL")
	}
	tables := idemmsg.Tables{Schema: schema, Outbox: o.table}
	archive, err := archiveRetention(o.archive)
	if err != nil {
		return err
	}
	if strings.HasPrefix(dbURL, "mysql://") || strings.HasPrefix(dbURL, "mariadb://") {
		return o.runBinlog(ctx, e, dbURL, tables, sub, archive)
	}
	if !strings.HasPrefix(dbURL, "postgres://") && !strings.HasPrefix(dbURL, "postgresql://") {
		return usagef("--db: idem cdc reads PostgreSQL's write-ahead log (postgres://) or MariaDB's or MySQL's binary log (mysql://); on SQLite run idem relay")
	}
	if sub == "reset-position" {
		return usagef("reset-position is for the binlog relay of MariaDB or MySQL (--db mysql://...); PostgreSQL's relay keeps its position in its slot (drop-slot)")
	}
	cfg := cdc.Config{Tables: tables, Slot: o.slot, Publication: o.publication, MessagePrefix: o.prefix,
		Window: o.window, BatchSize: o.batch, LagWarnBytes: o.lagWarn, QuarantineAfter: o.quarantineAfter,
		ArchiveRetention: archive, DueInterval: o.dueInterval}
	if o.keepRows {
		cfg.Delete = logrelay.KeepRows
	}
	cfg.RowsOnly, cfg.AcceptFailoverLoss = o.rowsOnly, o.acceptLoss
	if !dropSlot {
		hook, closeHook, err := o.quarantineEvents(ctx, dbURL, tables)
		if err != nil {
			return err
		}
		defer closeHook()
		cfg.OnQuarantine = hook
	}
	if dropSlot {
		name := cfg.WithDefaults().Slot
		if err := cdc.DropSlot(ctx, dbURL, name); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "dropped replication slot %s; the publication stays (DROP PUBLICATION %s removes it)\n", name, cfg.WithDefaults().Publication)
		return nil
	}
	log, err := newLogger(e, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	cfg.Logger = log
	if cfg.ProgressInterval, err = progressInterval(e); err != nil {
		return err
	}
	ops, err := o.ops.listen(e, log)
	if err != nil {
		return err
	}
	defer ops.close()
	closeTracing, err := startTracing(ctx, cdcServiceName, log)
	if err != nil {
		return err
	}
	defer closeTracing()
	pub, brokerURL, err := o.br.open(ctx, e)
	if err != nil {
		return err
	}
	defer pub.Close()
	metrics := cdcmetrics.New(cfg.WithDefaults().Slot)
	r, err := cdc.New(dbURL, pub, metrics.Instrument(cfg))
	if err != nil {
		return err
	}
	metrics.Watch(r)
	ops.serve(r.Healthy, metrics)
	startErr, stopErr := runUntilStopped(ctx, r, ops, o.stopTimeout, func() {
		log.Info("relaying from the write-ahead log", "slot", cfg.WithDefaults().Slot, "broker", brokerURL, "archive_retention", archiveLog(archive))
	})
	if startErr != nil {
		return startErr
	}
	if stopErr != nil {
		return fmt.Errorf("stop: messages in flight abandoned after %v (they are published again from the slot): %w", o.stopTimeout, stopErr)
	}
	s := r.Stats()
	log.Info("cdc relay stopped", "published", s.Published, "transactions", s.Transactions, "unreadable", s.Unreadable)
	return nil
}

// runBinlog runs "idem cdc" on MariaDB or MySQL: the binlog relay.
func (o *cdcOptions) runBinlog(ctx context.Context, e *env, dbURL string, tables idemmsg.Tables, sub string, archive time.Duration) error {
	switch sub {
	case "drop-slot":
		return usagef("drop-slot is for PostgreSQL; the binlog relay keeps no state on the server (reset-position forgets its stored position)")
	case "reset-position":
		if err := binlog.ResetPosition(ctx, dbURL, tables); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "forgot the binlog position of %s; the next start publishes the rows waiting in it, then reads the binlog from the server's current position\n", tables.WithDefaults().Outbox)
		return nil
	}
	if o.slot != "" || o.publication != "" || o.prefix != "" || o.rowsOnly || o.acceptLoss {
		return usagef("--slot, --publication, --prefix, --rows-only and --accept-failover-loss are PostgreSQL's; the binlog relay (mysql://) has none of them")
	}
	if o.serverID > 1<<32-1 {
		return usagef("--server-id %d: at most %d", o.serverID, uint32(1<<32-1))
	}
	log, err := newLogger(e, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	ops, err := o.ops.listen(e, log)
	if err != nil {
		return err
	}
	defer ops.close()
	cfg := binlog.Config{Tables: tables, ServerID: uint32(o.serverID), Window: o.window, BatchSize: o.batch,
		QuarantineAfter: o.quarantineAfter, ArchiveRetention: archive, DueInterval: o.dueInterval, Logger: log}
	hook, closeHook, err := o.quarantineEvents(ctx, dbURL, tables)
	if err != nil {
		return err
	}
	defer closeHook()
	cfg.OnQuarantine = hook
	if o.keepRows {
		cfg.Delete = logrelay.KeepRows
	}
	if cfg.ProgressInterval, err = progressInterval(e); err != nil {
		return err
	}
	closeTracing, err := startTracing(ctx, cdcServiceName, log)
	if err != nil {
		return err
	}
	defer closeTracing()
	pub, brokerURL, err := o.br.open(ctx, e)
	if err != nil {
		return err
	}
	defer pub.Close()
	label := "binlog_" + cfg.WithDefaults().Tables.Outbox
	metrics := cdcmetrics.New(label)
	cfg.Observer = metrics.Observer(cfg.Observer)
	r, err := binlog.New(dbURL, pub, cfg)
	if err != nil {
		return err
	}
	metrics.Watch(r)
	ops.serve(r.Healthy, metrics)
	startErr, stopErr := runUntilStopped(ctx, r, ops, o.stopTimeout, func() {
		log.Info("relaying from the binary log", "table", cfg.WithDefaults().Tables.Outbox, "broker", brokerURL, "archive_retention", archiveLog(archive))
	})
	if startErr != nil {
		return startErr
	}
	if stopErr != nil {
		return fmt.Errorf("stop: messages in flight abandoned after %v (they are published again from the stored position): %w", o.stopTimeout, stopErr)
	}
	s := r.Stats()
	log.Info("binlog relay stopped", "published", s.Published, "transactions", s.Transactions, "unreadable", s.Unreadable, "position", s.Position)
	return nil
}

// archiveLog is the archive's retention as the start-up line logs it.
func archiveLog(d time.Duration) string {
	if d < 0 {
		return "off (idem replay finds nothing this relay publishes)"
	}
	return d.String()
}

// archiveRetention parses --archive-retention: a positive duration (h, m,
// s or d), or 0 (0s, 0h, 0d), which turns the archive off (a negative
// retention in the relays' Config).
func archiveRetention(s string) (time.Duration, error) {
	if d, err := time.ParseDuration(strings.Replace(s, "d", "h", 1)); err == nil && d == 0 {
		return -1, nil
	}
	return parseDays("archive-retention", s)
}

// quarantineEvents returns the hook of --failure-events (nil without it):
// outbox.FailureEvents over the relayed outbox of dbURL, and the function
// that closes what it opened.
func (o *cdcOptions) quarantineEvents(ctx context.Context, dbURL string, tables idemmsg.Tables) (func(context.Context, driver.Executor, idemmsg.FailureNotice) error, func(), error) {
	if !o.failureEvents {
		return nil, func() {}, nil
	}
	db, err := registry.OpenDatabase(ctx, dbURL, registry.DatabaseOptions{Tables: tables})
	if err != nil {
		return nil, nil, err
	}
	return outbox.FailureEvents(outbox.NewWriter(db.SQL), outbox.FailureEventsConfig{}), db.Close, nil
}
