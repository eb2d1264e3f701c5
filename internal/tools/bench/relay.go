package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/relaymetrics"
)

// relayUsage is the part of the usage about "bench relay".
const relayUsage = `Usage:
  bench relay [--db URL] [--rows N] [--aggregates N] [--runs N] [--workers N] [--rate R] [--duration D] [--metrics]
             [--workers-curve 1,2,4,8] [--producers N] [--producer-duration D] [--triggers waiting,always,none]
             [--broker URL]

Runs in a scratch schema (idem_bench_<random>, dropped at the end) on the
database, with an in-process publisher that accepts everything at once, so
that what is measured is the relay and the database; with --broker, the
relay publishes to that broker instead (nats://embedded?dir=... for an
embedded NATS JetStream; with amqp://, bind a queue to the exchange first,
routing key #: RabbitMQ refuses messages nothing is bound for, and the
relay quarantines them), and step 2 is what it is measured against:

  1. throughput: a pre-filled outbox of --rows rows over --aggregates
     aggregates is drained by one relay (--workers workers); events/s;
  2. the database's own limit for the same work: a bare loop of --workers
     goroutines that claims and marks the same batches with the same SQL and
     publishes nothing; the relay's throughput is reported as a ratio to it;
  3. latency: events committed one per transaction at a steady --rate for
     --duration, after a second at that rate that is not counted (the
     relay's start); commit-to-publish delay (from Commit returning to the
     broker's confirm) p50/p99/max, with LISTEN/NOTIFY.

Steps 1 and 2 alternate --runs times; medians are reported.

  4. with --workers-curve, the drain of step 1 with each number of workers
     listed, --runs times in turn; medians, and each as a ratio to the best:
     more workers must never be slower than fewer;
  5. with --producer-duration, producer commits/s: --producers clients
     each committing one outbox event per transaction as fast as they can,
     for --producer-duration, with a relay draining, once per outbox trigger
     of --triggers (interleaved, --runs times; medians):
       waiting  the trigger idem installs (migration 0006): it notifies only
                while a relay waits for rows
       always   the trigger before 0006: every commit notifies, and takes
                the server's notification lock until its WAL flush
       none     the trigger disabled (ALTER TABLE outbox DISABLE TRIGGER),
                the relay polling every 50ms: the same inserts without any
                trigger, the reference of the ratios
     The latency of step 3 is measured with each trigger but none.

With --metrics the relay runs with its Prometheus metrics on (relaymetrics:
every histogram fed, the collector gathered after each drain, as a scrape
would), to measure what they cost: compare the ratios of runs with and
without it.

With IDEM_BENCH_TRACING=sdk, the relay traces with the OpenTelemetry SDK,
every span sampled and dropped by a no-op exporter, and every row carries a
traceparent as a traced producer's do: the cost of tracing. Unset, the
relay runs with OpenTelemetry's no-op tracer, as when tracing is off.

`

// options are the flags of every benchmark: those of one are ignored by the
// other.
type options struct {
	db               registry.DatabaseFlags
	rows, aggregates int
	runs, workers    int
	batch, rate      int
	duration         time.Duration
	metrics          bool
	cdc              cdcFlags
	curve            string
	producers        int
	producerDuration time.Duration
	busyPoll         time.Duration
	triggers         string
	binlog           binlogFlags
	drain            drainFlags
	// set holds the names of the flags given on the command line.
	set map[string]bool
}

// registerFlags declares the flags of every benchmark on fs.
func registerFlags(fs *flag.FlagSet) *options {
	o := &options{set: map[string]bool{}}
	o.db.Register(fs)
	fs.IntVar(&o.rows, "rows", 100_000, "rows in the pre-filled outbox (bench binlog: 50000 unless given)")
	fs.IntVar(&o.aggregates, "aggregates", 10_000, "aggregates the rows belong to")
	fs.IntVar(&o.runs, "runs", 3, "throughput runs (relay and bare loop each)")
	fs.IntVar(&o.workers, "workers", relay.WorkersDefault, "relay workers")
	fs.IntVar(&o.batch, "batch-size", relay.BatchSizeDefault, "rows per claim")
	fs.IntVar(&o.rate, "rate", 1000, "events per second in the latency test; 0 skips it")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of the latency test")
	fs.BoolVar(&o.metrics, "metrics", false, "run the relay with its Prometheus metrics on")
	o.cdc.register(fs)
	fs.StringVar(&o.curve, "workers-curve", "", "comma-separated worker counts to drain with (e.g. 1,2,4,8); empty skips it")
	fs.IntVar(&o.producers, "producers", 16, "clients committing in the producer test")
	fs.DurationVar(&o.producerDuration, "producer-duration", 0, "length of each producer commits/s measure; 0 skips it")
	fs.DurationVar(&o.busyPoll, "busy-poll", 0, "the relay's BusyPollInterval (0: off, the default)")
	fs.StringVar(&o.triggers, "triggers", "waiting,always,none", "outbox triggers to measure the producers and the latency with")
	o.binlog.register(fs)
	o.drain.register(fs)
	return o
}

// runBenchRelay runs "bench relay".
func runBenchRelay(ctx context.Context, e *env, o *options) error {
	if o.rows <= 0 || o.aggregates <= 0 || o.runs <= 0 || o.workers <= 0 || o.batch <= 0 || o.rate < 0 || o.producers <= 0 {
		return usagef("--rows, --aggregates, --runs, --workers, --batch-size and --producers must be positive")
	}
	counts, err := parseCounts(o.curve)
	if err != nil {
		return usagef("--workers-curve: %v", err)
	}
	designs, err := parseTriggers(o.triggers)
	if err != nil {
		return usagef("--triggers: %v", err)
	}
	conn, err := o.db.Open(ctx, e.getenv)
	if err != nil {
		return err
	}
	defer conn.Close()
	if conn.Pgx == nil {
		return fmt.Errorf("bench relay needs PostgreSQL")
	}
	b := &bench{e: e, rows: o.rows, aggregates: o.aggregates, workers: o.workers, batch: o.batch,
		busyPoll: o.busyPoll, curve: counts, producers: o.producers, producerDuration: o.producerDuration, triggers: designs}
	if o.metrics {
		b.metrics = relaymetrics.New()
		b.registry = prometheus.NewRegistry()
		b.registry.MustRegister(b.metrics)
	}
	switch mode := e.getenv("IDEM_BENCH_TRACING"); mode {
	case "":
	case "sdk":
		b.traced = true
		defer benchTracing()()
	default:
		return usagef("IDEM_BENCH_TRACING=%q: want sdk, or unset", mode)
	}
	if u := o.cdc.broker.URL; u != "" {
		pub, err := registry.Open(ctx, u)
		if err != nil {
			return fmt.Errorf("--broker: %w", err)
		}
		defer pub.Close()
		b.pub, b.brokerURL = pub, broker.RedactURL(u)
	}
	if err := b.setup(ctx, conn.Pgx.Pgx()); err != nil {
		return err
	}
	defer b.teardown()
	return b.run(ctx, o.runs, o.rate, o.duration)
}

type bench struct {
	e                                *env
	rows, aggregates, workers, batch int
	// curve: the worker counts of the curve; producers and
	// producerDuration: the producer commits/s test; triggers: the outbox
	// triggers it and the latency test run with.
	curve            []int
	busyPoll         time.Duration
	producers        int
	producerDuration time.Duration
	triggers         []string
	admin, pool      *pgxpool.Pool
	schema           string
	drv              *postgres.PgxDriver
	// metrics, when set, instrument the relay; registry holds them.
	metrics  *relaymetrics.Metrics
	registry *prometheus.Registry
	// traced: the relay traces with the SDK (IDEM_BENCH_TRACING=sdk), and
	// rows carry a traceparent.
	traced bool
	// pub, with --broker, is the broker the relay publishes to; nil: an
	// in-process publisher that accepts everything.
	pub       broker.Publisher
	brokerURL string
}

// benchTracing installs the OpenTelemetry SDK as the global tracer
// provider, sampling every span, with a batching processor whose exporter
// drops them, and returns the function that removes it.
func benchTracing() func() {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return func() {
		otel.SetTracerProvider(prev)
		_ = tp.Shutdown(context.Background())
	}
}

// discardExporter drops every span.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

func (b *bench) setup(ctx context.Context, base *pgxpool.Pool) error {
	raw := make([]byte, 4)
	_, _ = rand.Read(raw)
	b.schema = "idem_bench_" + hex.EncodeToString(raw)
	b.admin = base
	if _, err := base.Exec(ctx, "CREATE SCHEMA "+postgres.QuoteIdent(b.schema)); err != nil {
		return err
	}
	cfg := base.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = b.schema
	// The 16 producers of the latency test, and for the relay a connection per
	// worker plus its listener: a relay starved of connections would measure
	// the pool, not the relay.
	most := b.workers
	for _, w := range b.curve {
		most = max(most, w)
	}
	cfg.MaxConns = int32(most) + int32(max(16, b.producers)) + 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	b.pool = pool
	// Open every connection now: a connection opened during the latency
	// test costs hundreds of milliseconds on a loaded server, and would
	// measure PostgreSQL's start-up of a backend, not the relay.
	conns := make([]*pgxpool.Conn, 0, cfg.MaxConns)
	for range cfg.MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			for _, c := range conns {
				c.Release()
			}
			return err
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	b.drv = postgres.NewPgx(pool)
	_, err = migrate.New(b.drv).Up(ctx)
	return err
}

func (b *bench) teardown() {
	if b.pool != nil {
		b.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.admin.Exec(ctx, "DROP SCHEMA "+postgres.QuoteIdent(b.schema)+" CASCADE"); err != nil {
		fmt.Fprintf(b.e.stderr, "drop schema %s: %v\n", b.schema, err)
	}
}

// fill empties the outbox and inserts the benchmark's rows, as committed
// events waiting for the relay.
func (b *bench) fill(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, "TRUNCATE outbox"); err != nil {
		return err
	}
	_, err := b.pool.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers)
SELECT gen_random_uuid(), 'order', (g % $2)::text, 'order.order.changed.v1',
       jsonb_build_object('order_id', g % $2, 'lines', 3, 'total_cents', 4299, 'currency', 'EUR'),
       now(), g / $2 + 1,
       CASE WHEN $3 THEN jsonb_build_object('traceparent', '00-' || md5(g::text) || '-' || left(md5('s' || g), 16) || '-01')
            ELSE '{}' END
FROM generate_series(0, $1 - 1) AS g`, b.rows, b.aggregates, b.traced)
	if err != nil {
		return err
	}
	_, err = b.pool.Exec(ctx, "VACUUM ANALYZE outbox")
	return err
}

func (b *bench) run(ctx context.Context, runs, rate int, duration time.Duration) error {
	out := b.e.stdout
	fmt.Fprintf(out, "bench relay: %d rows over %d aggregates, %d workers, batch %d, metrics %v\n",
		b.rows, b.aggregates, b.workers, b.batch, map[bool]string{true: "on", false: "off"}[b.metrics != nil])
	if b.pub != nil {
		fmt.Fprintf(out, "publishing to %s (the bare loop publishes nothing)\n", b.brokerURL)
	}
	if b.traced {
		fmt.Fprintln(out, "tracing: OpenTelemetry SDK, every span sampled, dropped by a no-op exporter; every row carries a traceparent")
	}
	var relayRates, bareRates []float64
	for i := 1; i <= runs; i++ {
		if err := b.fill(ctx); err != nil {
			return err
		}
		d, err := b.drainRelay(ctx)
		if err != nil {
			return err
		}
		relayRates = append(relayRates, float64(b.rows)/d.Seconds())
		if err := b.fill(ctx); err != nil {
			return err
		}
		bd, err := b.drainBare(ctx)
		if err != nil {
			return err
		}
		bareRates = append(bareRates, float64(b.rows)/bd.Seconds())
		fmt.Fprintf(out, "run %d: relay %8.0f events/s (%v)   bare claim+mark %8.0f rows/s (%v)   ratio %.2f\n",
			i, relayRates[i-1], d.Round(time.Millisecond), bareRates[i-1], bd.Round(time.Millisecond), relayRates[i-1]/bareRates[i-1])
	}
	mr, mb := median(relayRates), median(bareRates)
	fmt.Fprintf(out, "median: relay %.0f events/s, bare claim+mark %.0f rows/s, ratio %.2f\n", mr, mb, mr/mb)

	if len(b.curve) > 0 {
		if err := b.workersCurve(ctx, runs); err != nil {
			return err
		}
	}
	if b.producerDuration > 0 {
		if err := b.producerCommits(ctx, runs); err != nil {
			return err
		}
	}
	if rate > 0 {
		for _, trigger := range b.triggers {
			if trigger == "none" {
				continue
			}
			if err := b.setTrigger(ctx, trigger); err != nil {
				return err
			}
			if _, err := b.pool.Exec(ctx, "TRUNCATE outbox"); err != nil {
				return err
			}
			lat, err := b.latency(ctx, rate, duration)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "latency at %d events/s for %v (%d events, LISTEN/NOTIFY, trigger %s): commit-to-publish p50 %v  p99 %v  max %v\n",
				rate, duration, len(lat), trigger, percentile(lat, 50), percentile(lat, 99), percentile(lat, 100))
		}
		if err := b.setTrigger(ctx, "waiting"); err != nil {
			return err
		}
	}
	return nil
}

// workersCurve drains the outbox with each worker count of the curve, runs
// times in turn, and prints the medians.
func (b *bench) workersCurve(ctx context.Context, runs int) error {
	out := b.e.stdout
	rates := map[int][]float64{}
	saved := b.workers
	defer func() { b.workers = saved }()
	for range runs {
		for _, w := range b.curve {
			if err := b.fill(ctx); err != nil {
				return err
			}
			b.workers = w
			d, err := b.drainRelay(ctx)
			if err != nil {
				return err
			}
			rates[w] = append(rates[w], float64(b.rows)/d.Seconds())
		}
	}
	best := 0.0
	for _, w := range b.curve {
		best = max(best, median(rates[w]))
	}
	fmt.Fprintf(out, "workers curve (%d rows, batch %d, median of %d):", b.rows, b.batch, runs)
	for _, w := range b.curve {
		m := median(rates[w])
		fmt.Fprintf(out, "  %d: %.0f events/s (%.2f)", w, m, m/best)
	}
	fmt.Fprintln(out)
	return nil
}

// triggerDesigns are the outbox triggers the bench can install.
var triggerDesigns = []string{"waiting", "always", "none"}

func parseTriggers(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(triggerDesigns, f) {
			return nil, fmt.Errorf("%q: want among %s", f, strings.Join(triggerDesigns, ", "))
		}
		out = append(out, f)
	}
	return out, nil
}

func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// setTrigger installs one of the triggerDesigns on the bench's outbox: the
// function of migration 0006 (waiting) or the one it replaced (always),
// from the dialect's own migration, or no trigger at all (none).
func (b *bench) setTrigger(ctx context.Context, design string) error {
	var body string
	for _, m := range b.drv.Dialect().Migrations() {
		if m.Version == 6 {
			body = map[string]string{"waiting": m.Up, "always": m.Down, "none": m.Up}[design]
		}
	}
	if body == "" {
		return fmt.Errorf("bench: no migration 6 in the PostgreSQL dialect")
	}
	enable := "ENABLE"
	if design == "none" {
		enable = "DISABLE"
	}
	_, err := b.pool.Exec(ctx, body+";\nALTER TABLE outbox "+enable+" TRIGGER outbox_notify")
	return err
}

// producerCommits measures the commits/s of b.producers clients, each
// committing one outbox event per transaction, with each trigger design,
// while a relay drains the outbox.
func (b *bench) producerCommits(ctx context.Context, runs int) error {
	out := b.e.stdout
	rates := map[string][]float64{}
	for range runs {
		for _, design := range b.triggers {
			if err := b.setTrigger(ctx, design); err != nil {
				return err
			}
			if _, err := b.pool.Exec(ctx, "TRUNCATE outbox"); err != nil {
				return err
			}
			n, err := b.produce(ctx, design)
			if err != nil {
				return err
			}
			rates[design] = append(rates[design], float64(n)/b.producerDuration.Seconds())
		}
	}
	if err := b.setTrigger(ctx, "waiting"); err != nil {
		return err
	}
	ref := median(rates["none"])
	fmt.Fprintf(out, "producer commits/s (%d clients, one event per transaction, %v, median of %d):", b.producers, b.producerDuration, runs)
	for _, design := range b.triggers {
		m := median(rates[design])
		fmt.Fprintf(out, "  %s %.0f", design, m)
		if ref > 0 && design != "none" {
			fmt.Fprintf(out, " (%.2f of none)", m/ref)
		}
	}
	fmt.Fprintln(out)
	return nil
}

// produce runs the producers for b.producerDuration with a relay draining
// (listening, but polling every 50ms when the trigger is off) and returns
// the number of commits.
func (b *bench) produce(ctx context.Context, design string) (int64, error) {
	cfg := b.relayConfig()
	if design == "none" {
		cfg.DisableListen = true
		cfg.PollInterval = relay.PollIntervalNoListenDefault
	}
	r, err := relay.New(b.drv, &countingPublisher{next: b.pub}, cfg)
	if err != nil {
		return 0, err
	}
	if err := r.Start(ctx); err != nil {
		return 0, err
	}
	defer func() { _ = r.Stop(context.Background()) }()
	w := outbox.NewWriter(b.drv)
	var commits atomic.Int64
	pctx, cancel := context.WithTimeout(ctx, b.producerDuration)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, b.producers)
	for p := range b.producers {
		wg.Go(func() {
			for i := 0; pctx.Err() == nil; i++ {
				ev, err := idemmsg.NewEvent("order.order.changed.v1", "order", fmt.Sprint(p, "-", i%100), map[string]int{"n": i})
				if err != nil {
					errs <- err
					return
				}
				err = pgx.BeginFunc(pctx, b.pool, func(tx pgx.Tx) error { return w.Add(pctx, tx, ev) })
				if err != nil {
					if pctx.Err() == nil {
						errs <- err
					}
					return
				}
				commits.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return commits.Load(), nil
}

// countingPublisher accepts everything and counts; with times set, it
// records when each event was confirmed.
type countingPublisher struct {
	// next, when set, is the broker the messages go to (--broker); the
	// messages it accepted are counted. Unset, every message is accepted.
	next  broker.Publisher
	n     atomic.Int64
	mu    sync.Mutex
	times map[uuid.UUID]time.Time
}

func (p *countingPublisher) Publish(ctx context.Context, msgs []idemmsg.Message) error {
	var err error
	if p.next != nil {
		err = p.next.Publish(ctx, msgs)
	}
	results := broker.Results(err, len(msgs))
	now := time.Now()
	var accepted int64
	p.mu.Lock()
	for i, m := range msgs {
		if results[i] != nil {
			continue
		}
		accepted++
		if _, ok := p.times[m.EventID]; !ok && p.times != nil {
			p.times[m.EventID] = now
		}
	}
	p.mu.Unlock()
	p.n.Add(accepted)
	return err
}

func (b *bench) relayConfig() relay.Config {
	cfg := relay.Config{
		Workers:          b.workers,
		BatchSize:        b.batch,
		StatsInterval:    -1,
		Retention:        -1,
		BusyPollInterval: b.busyPoll,
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if b.metrics != nil {
		cfg = b.metrics.Instrument(cfg)
	}
	return cfg
}

// watch exports r's metrics, when they are on.
func (b *bench) watch(r relaymetrics.StatsSource) {
	if b.metrics != nil {
		b.metrics.Watch(r)
	}
}

// scrape gathers the metrics, when they are on, as Prometheus would.
func (b *bench) scrape() error {
	if b.registry == nil {
		return nil
	}
	_, err := b.registry.Gather()
	return err
}

func (b *bench) drainRelay(ctx context.Context) (time.Duration, error) {
	pub := &countingPublisher{next: b.pub}
	r, err := relay.New(b.drv, pub, b.relayConfig())
	if err != nil {
		return 0, err
	}
	b.watch(r)
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		return 0, err
	}
	defer func() { _ = r.Stop(context.Background()) }()
	for r.Stats().Published < int64(b.rows) {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start), b.scrape()
}

// drainBare claims and marks as the relay does (the same statements, the
// same round trips) and publishes nothing.
func (b *bench) drainBare(ctx context.Context) (time.Duration, error) {
	d := b.drv.Dialect()
	cfg := b.relayConfig().WithDefaults()
	var marked atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, b.workers)
	for range b.workers {
		wg.Go(func() {
			for marked.Load() < int64(b.rows) {
				owner := uuid.New()
				rows, err := b.drv.ClaimOutbox(ctx, cfg.ClaimParams(owner))
				if err != nil {
					errs <- err
					return
				}
				seqs := make([]int64, len(rows))
				for i := range rows {
					seqs[i] = rows[i].Seq
				}
				n, err := d.MarkPublished(ctx, b.drv.Pool(), owner, seqs)
				if err != nil {
					errs <- err
					return
				}
				marked.Add(n)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// commitAtRate runs commit(0) to commit(total-1) at a steady rate per
// second over 16 clients, and returns when each committed event's commit
// returned.
func commitAtRate(total, rate int, commit func(i int) (uuid.UUID, error)) (map[uuid.UUID]time.Time, error) {
	ticks := make(chan int, total)
	var mu sync.Mutex
	committed := make(map[uuid.UUID]time.Time, total)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for i := range ticks {
				id, err := commit(i)
				at := time.Now()
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				committed[id] = at
				mu.Unlock()
			}
		})
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		ticks <- i
	}
	close(ticks)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return committed, nil
}

// warmThenCommit commits a second's worth of events at rate (not counted:
// the relay's start is not its pace), waits until arrived counts them,
// calls reset (when set), then commits total events and waits until they
// arrived too. It returns when each counted event committed; commit gets
// the event's index, from 0 across both parts.
func warmThenCommit(rate, total int, commit func(i int) (uuid.UUID, error), arrived func() int, reset func()) (map[uuid.UUID]time.Time, error) {
	part := func(n, from int) (map[uuid.UUID]time.Time, error) {
		committed, err := commitAtRate(n, rate, func(i int) (uuid.UUID, error) { return commit(from + i) })
		if err != nil {
			return nil, err
		}
		for deadline := time.Now().Add(60 * time.Second); arrived() < from+n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%d of %d events arrived within 60s of the last commit", arrived(), from+n)
			}
		}
		return committed, nil
	}
	if _, err := part(rate, 0); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	if reset != nil {
		reset()
	}
	return part(total, rate)
}

func (b *bench) latency(ctx context.Context, rate int, duration time.Duration) ([]time.Duration, error) {
	pub := &countingPublisher{next: b.pub, times: map[uuid.UUID]time.Time{}}
	r, err := relay.New(b.drv, pub, b.relayConfig())
	if err != nil {
		return nil, err
	}
	b.watch(r)
	if err := r.Start(ctx); err != nil {
		return nil, err
	}
	defer func() { _ = r.Stop(context.Background()) }()

	w := outbox.NewWriter(b.drv)
	committed, err := warmThenCommit(rate, int(duration.Seconds()*float64(rate)), func(i int) (uuid.UUID, error) {
		ev, err := idemmsg.NewEvent("order.order.changed.v1", "order", fmt.Sprint(i%1000), map[string]int{"n": i})
		if err != nil {
			return uuid.Nil, err
		}
		pctx, span := ctx, trace.Span(nil)
		if b.traced {
			pctx, span = otel.Tracer("idem-bench").Start(ctx, "produce")
		}
		err = pgx.BeginFunc(pctx, b.pool, func(tx pgx.Tx) error { return w.Add(pctx, tx, ev) })
		if span != nil {
			span.End()
		}
		return ev.ID, err
	}, func() int { return int(pub.n.Load()) }, nil)
	if err != nil {
		return nil, err
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	out := make([]time.Duration, 0, len(committed))
	for id, c := range committed {
		p, ok := pub.times[id]
		if !ok {
			return nil, fmt.Errorf("event %s counted but not published", id)
		}
		out = append(out, max(0, p.Sub(c)))
	}
	return out, nil
}

// median returns the median of v, 0 when v is empty.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func percentile(v []time.Duration, p int) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	i = min(max(i-1, 0), len(s)-1)
	return s[i].Round(10 * time.Microsecond)
}
