package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/internal/telemetry"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/relaymetrics"
)

// brokerFlags are the flags of every command that publishes: --broker (or
// --broker-file).
type brokerFlags struct{ registry.BrokerFlags }

func (f *brokerFlags) register(fs *flag.FlagSet) {
	f.Register(fs)
	envflag.FileFlag(fs, "broker")
}

func (f *brokerFlags) open(ctx context.Context, e *env) (registry.Publisher, string, error) {
	u := f.Resolve(e.getenv)
	pub, err := registry.Open(ctx, u)
	return pub, broker.RedactURL(u), err
}

// relayServiceName is the default service name of the relay's spans.
const relayServiceName = "idem-relay"

// startTracing sets up the OTEL_* tracing of a relay command (the global
// tracer provider and propagator, which the relays use by default); the
// function returned exports what is buffered and stops it.
func startTracing(ctx context.Context, service string, log *slog.Logger) (func(), error) {
	tracing, err := telemetry.Setup(ctx, service, log)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if tracing.Enabled() {
		log.Info("tracing on", "exporter", tracing.Exporter)
	}
	return func() { tracing.Close(log) }, nil
}

// relayCommand is "idem relay".
func relayCommand() *command {
	return &command{
		name:    "relay",
		summary: "publish committed outbox rows to the broker (runs until SIGTERM)",
		usage: `Usage:
  idem relay [--db URL] [--broker URL] [--workers N] [flags]

Runs the polling relay: workers claim unpublished outbox rows under a lease,
publish them with broker confirms, and mark them published. Events of one
aggregate are published in order; a relay that dies leaves leases that other
relays take over when they expire. Several relays can run on one database.

It runs on every database idem supports. On PostgreSQL, LISTEN/NOTIFY wakes
it as rows commit (it also polls every --poll-interval, 1s by default). On
MySQL/MariaDB and SQLite it polls, every 50ms by default: a row waits up to
--poll-interval, and each poll is one claim (a few indexed reads) even when
there is nothing to publish. Its connection pool holds one connection per
worker and four more for its background reads: count them in the server's
max_connections. On SQLite it uses one connection whatever --workers (one
writer at a time; the file may be shared with the application's process):
more workers do not publish faster there. On MariaDB, "idem cdc" reads the
binary log instead of polling.

An id that is not a UUID (1 to 64 bytes of text, as another program may
write) is published under the UUID idem.EventID derives from it, with the id
in the header idem-original-id. A row the relay cannot turn into a message
(an empty id or one over 64 bytes, headers that are not a JSON object, no
event name...) is quarantined at its first claim; a row the broker refuses
itself (unroutable, nacked, rejected, too large) is retried with backoff and
quarantined after --quarantine-after attempts. Each quarantine is logged at
error level with the row's seq, id, aggregate and error. A quarantined row is
not published and the later rows of its aggregate wait behind it; every other
aggregate flows. A broker that is down or does not answer in time only pauses
the relay: it never gets a row quarantined, however long it lasts. List, show,
re-drive and remove quarantined rows with "idem failed ... --relay"; the
idem_relay_quarantined_rows gauge counts them. With --failure-events, each
quarantine also writes a notice (event idem.failure.outbox_row.quarantined.v1:
the row's table and seq, class, group, error, event id and aggregate, not
its payload) into the outbox in the quarantine's transaction, which the
relay publishes to whoever subscribes to idem.failure.#.

On SIGTERM or SIGINT the relay stops claiming, finishes or releases the
batches in flight (up to --stop-timeout) and exits.

It serves, at --metrics-addr (127.0.0.1:9464: loopback only), Prometheus
metrics on /metrics (idem_relay_*: backlog, oldest unpublished age,
quarantined rows, claim, publish and mark durations, commit-to-publish delay,
messages in flight; see docs/OPERATIONS.md), a health check on /healthz (200
"ok" while it can claim from the database, 503 "not ok" otherwise) and, with
--pprof, the Go profiles on /debug/pprof/ (never the command line). An
address beyond loopback (:9464, 0.0.0.0:9464) needs a bearer token on every
request but /healthz: put it in a file and give --auth-token-file FILE (or
set IDEM_METRICS_TOKEN); Prometheus sends it with authorization:
credentials_file. --insecure-no-auth serves it without one, when something
in front authenticates.

The URLs can hold passwords: give them in IDEM_DB_URL and IDEM_BROKER_URL,
or in files (--db-file, --broker-file), rather than on the command line,
where every user of the machine can read them (ps, /proc). Logs and errors
show them without their passwords.

With tracing on (OTEL_* variables below), each published message has a
producer span, child of the span whose trace context the row's headers carry
(outbox.Writer writes it), so one trace runs from the request that wrote the
row through the relay to every consumer.

Examples:
  IDEM_DB_URL=postgres://app@localhost/shop IDEM_BROKER_URL=amqp://localhost/ idem relay
  idem relay --db-file /run/secrets/db-url --broker-file /run/secrets/broker-url --workers 4 --log-format json
  idem relay --metrics-addr :9464 --auth-token-file /run/secrets/metrics-token --pprof
  IDEM_DB_URL=mysql://relay@db:3306/shop IDEM_BROKER_URL=amqp://localhost/ idem relay
  idem relay --db sqlite:/var/lib/shop/shop.db --broker nats://localhost:4222
  OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 idem relay

` + fmt.Sprintf(telemetry.Help, relayServiceName),
		setup: setupRelay,
	}
}

// relayOptions holds the flags of "idem relay".
type relayOptions struct {
	db              dbFlags
	br              brokerFlags
	workers         int
	batch           int
	perAgg          int
	lease           time.Duration
	publishTimeout  time.Duration
	poll            time.Duration
	noListen        bool
	retention       time.Duration
	quarantineAfter int
	failureEvents   bool
	ops             opsFlags
	stopTimeout     time.Duration
	logFormat       string
	logLevel        string
}

// setupRelay declares the flags of "idem relay" on fs and returns the
// function that runs the command.
func setupRelay(fs *flag.FlagSet) runFunc {
	o := &relayOptions{}
	o.db.register(fs)
	o.br.register(fs)
	fs.IntVar(&o.workers, "workers", relay.WorkersDefault, "number of workers claiming and publishing concurrently")
	fs.IntVar(&o.batch, "batch-size", relay.BatchSizeDefault, "maximum rows per claim")
	fs.IntVar(&o.perAgg, "max-per-aggregate", 0, "maximum rows of one aggregate per claim (default 100)")
	fs.DurationVar(&o.lease, "lease", relay.LeaseDefault, "how long a claim is owned before other workers may take it over")
	fs.DurationVar(&o.publishTimeout, "publish-timeout", 0, "bound on each publish call (default min(10s, lease/3))")
	fs.DurationVar(&o.poll, "poll-interval", 0, "poll period when no notification arrives (default 1s with LISTEN/NOTIFY on PostgreSQL, 50ms without: MySQL/MariaDB, SQLite, --no-listen)")
	fs.BoolVar(&o.noListen, "no-listen", false, "do not LISTEN for notifications; only poll (PostgreSQL; the other databases always poll)")
	fs.DurationVar(&o.retention, "retention", relay.RetentionDefault, "keep published rows this long (the replay window); negative: forever")
	fs.IntVar(&o.quarantineAfter, "quarantine-after", relay.QuarantineAfterDefault, "quarantine a row the broker refused on this many attempts (negative: retry forever)")
	fs.BoolVar(&o.failureEvents, "failure-events", false, "write a notice of each row quarantined into the outbox (idem.failure.outbox_row.quarantined.v1), which the relay publishes")
	o.ops.register(fs, "127.0.0.1:9464")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 30*time.Second, "on SIGTERM, how long in-flight batches may take to finish")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return o.run
}

// run runs "idem relay" with the positional arguments args.
func (o *relayOptions) run(ctx context.Context, e *env, args []string) error {
	if len(args) != 0 {
		return usagef("unexpected arguments %q", args)
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
	closeTracing, err := startTracing(ctx, relayServiceName, log)
	if err != nil {
		return err
	}
	defer closeTracing()
	conn, err := o.db.open(ctx, e)
	if err != nil {
		return err
	}
	defer conn.Close()
	pub, brokerURL, err := o.br.open(ctx, e)
	if err != nil {
		return err
	}
	defer pub.Close()

	metrics := relaymetrics.New()
	cfg := relay.Config{
		Workers:         o.workers,
		BatchSize:       o.batch,
		MaxPerAggregate: o.perAgg,
		Lease:           o.lease,
		PublishTimeout:  o.publishTimeout,
		PollInterval:    o.poll,
		DisableListen:   o.noListen,
		Retention:       o.retention,
		QuarantineAfter: o.quarantineAfter,
		Logger:          log,
	}
	if o.failureEvents {
		cfg.OnQuarantine = outbox.FailureEvents(outbox.NewWriter(conn.SQL), outbox.FailureEventsConfig{})
	}
	r, err := conn.NewRelay(ctx, pub, metrics.Instrument(cfg))
	if err != nil {
		return err
	}
	metrics.Watch(r)

	ops.serve(r.Healthy, metrics)

	startErr, stopErr := runUntilStopped(ctx, r, ops, o.stopTimeout, func() {
		log.Info("relaying", "db", conn.Redacted(), "broker", brokerURL)
	})
	if startErr != nil {
		return startErr
	}
	if stopErr != nil {
		return fmt.Errorf("stop: in-flight batches released after %v: %w", o.stopTimeout, stopErr)
	}
	s := r.Stats()
	log.Info("relay stopped", "published", s.Published, "publish_errors", s.PublishErrors, "quarantined", s.Quarantined)
	return nil
}
