package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/procstat"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// drainUsage is the part of the usage about "bench drain".
const drainUsage = `

  bench drain [--drain-db URL]... [--rows N] [--drain-aggregates N,N] [--runs N]
              [--workers N] [--batch-size N] [--drain-timeout D] [--broker URL] [--cpuprofile FILE]

The polling relay's drain on every dialect, and over few and many
aggregates, in one run. On each database (--drain-db, repeated: postgres://,
mysql:// or mariadb://, sqlite:DIR; default --db), in a scratch schema,
database or file idem_bench_drain_<random> (removed at the end), an outbox
of --rows rows (50,000 unless given) over each number of aggregates of
--drain-aggregates (100,10000 unless given; row i belongs to aggregate i mod
N, as concurrent writers interleave them), committed in transactions of
1,000 while no relay runs, is drained by the relay "idem relay" runs
(pgx and LISTEN/NOTIFY on PostgreSQL, database/sql and 50 ms polls
elsewhere, its pool; its defaults but --workers and --batch-size) to an
in-process publisher that accepts everything, or with --broker to that
broker (with amqp://, bind a queue to the exchange first, as for bench
relay). For each drain: events/s from
the relay's start until every row is marked published; CPU ms per 1,000
events of this process (the relay, and SQLite itself) and of the database
server (PostgreSQL: the postmaster and its children, from its
postmaster.pid; MariaDB: the pid in @@pid_file; shared with whatever else
runs on that server); how many cores of the machine were busy; and the
leases that did not hold: rows claimed from an expired lease (Stats.Takeovers),
rows given back because their lease was about to expire (Stats.Released),
confirmed rows not marked because their lease had ended (Stats.LeasesLost).
Databases and numbers of aggregates alternate --runs times; medians, and per
database the ratio of the last number of aggregates to the first (10,000 /
100 by default), per run and of the medians. A drain not done within
--drain-timeout fails the benchmark. --cpuprofile FILE writes a CPU profile
of this process during each drain (FILE.<dialect>.<aggregates>.<run>).
`

// drainFlags are the flags of "bench drain" alone.
type drainFlags struct {
	dbs        dbList
	aggregates string
	timeout    time.Duration
}

// dbList is a repeated flag of database URLs.
type dbList []string

func (l *dbList) String() string     { return strings.Join(*l, " ") }
func (l *dbList) Set(s string) error { *l = append(*l, s); return nil }

func (f *drainFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.dbs, "drain-db", "bench drain: a database to drain on, repeated for several (postgres://..., mysql://..., sqlite:DIR); default --db")
	fs.StringVar(&f.aggregates, "drain-aggregates", "100,10000", "bench drain: comma-separated numbers of aggregates the rows belong to, each drained in turn")
	fs.DurationVar(&f.timeout, "drain-timeout", 5*time.Minute, "bench drain: the longest a drain may take")
}

// drainSQL are the statements of "bench drain" that differ per dialect:
// emptying the outbox, updating its statistics after a fill, and removing
// the scratch schema or database (SQLite: its file is removed).
var drainSQL = map[string]struct{ empty, analyze, drop string }{
	registry.Postgres: {"TRUNCATE outbox", "VACUUM ANALYZE outbox", "DROP SCHEMA %s CASCADE"},
	registry.MySQL:    {"TRUNCATE TABLE outbox", "ANALYZE TABLE outbox", "DROP DATABASE %s"},
	registry.SQLite:   {"DELETE FROM outbox", "ANALYZE", ""},
}

// drainTarget is one database of "bench drain".
type drainTarget struct {
	db  *registry.Database
	pid int // the server's process, 0 when unknown (SQLite: this process)
}

// drainRun is one drain's figures.
type drainRun struct {
	rate                float64
	relayCPU, serverCPU time.Duration
	// serverKnown: serverCPU was measured (the server's process is known
	// and was not restarted during the drain).
	serverKnown                   bool
	cores                         float64
	takeovers, released, lostMark int64
	warnings                      int64
}

// benchDrain is one run of "bench drain".
type benchDrain struct {
	e          *env
	o          *options
	rows       int
	aggregates []int
	name       string
	targets    []*drainTarget
	warnings   atomic.Int64
	log        *slog.Logger
	// pub, with --broker, is the broker the relay publishes to; nil: an
	// in-process publisher that accepts everything.
	pub       broker.Publisher
	brokerURL string
}

// runBenchDrain runs "bench drain".
func runBenchDrain(ctx context.Context, e *env, o *options) error {
	rows := o.rows
	if !o.set["rows"] {
		rows = 50_000
	}
	aggs, err := parseCounts(o.drain.aggregates)
	if err != nil || len(aggs) == 0 {
		return usagef("--drain-aggregates %q: want comma-separated positive numbers", o.drain.aggregates)
	}
	if rows <= 0 || o.runs <= 0 || o.workers <= 0 || o.batch <= 0 || o.drain.timeout <= 0 {
		return usagef("--rows, --runs, --workers, --batch-size and --drain-timeout must be positive")
	}
	urls := []string(o.drain.dbs)
	if len(urls) == 0 {
		u, _ := o.db.Resolve(e.getenv)
		if u == "" {
			return usagef("no database: pass --drain-db (or --db)")
		}
		urls = []string{u}
	}
	raw := make([]byte, 4)
	_, _ = rand.Read(raw)
	b := &benchDrain{e: e, o: o, rows: rows, aggregates: aggs, name: "idem_bench_drain_" + hex.EncodeToString(raw)}
	// Only the relays' warnings and errors, counted, on the standard error.
	b.log = slog.New(&countingHandler{next: slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), n: &b.warnings})
	if u := o.cdc.broker.URL; u != "" {
		pub, err := registry.Open(ctx, u)
		if err != nil {
			return fmt.Errorf("--broker: %w", err)
		}
		defer pub.Close()
		b.pub, b.brokerURL = pub, broker.RedactURL(u)
	}
	defer b.teardown()
	for _, u := range urls {
		if err := b.open(ctx, u); err != nil {
			return err
		}
	}
	return b.run(ctx)
}

// open opens the scratch schema, database or file on the database at u,
// migrated, and finds its server's process.
func (b *benchDrain) open(ctx context.Context, u string) error {
	db, err := registry.OpenDatabase(ctx, u, registry.DatabaseOptions{Name: b.name})
	if err != nil {
		return err
	}
	t := &drainTarget{db: db}
	b.targets = append(b.targets, t)
	if _, err := migrate.New(db.SQL).Up(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", db.Redacted(), err)
	}
	var pidFile string
	switch db.Dialect {
	case registry.Postgres:
		var dir string
		if err := db.DB.QueryRowContext(ctx, `SELECT setting FROM pg_settings WHERE name = 'data_directory'`).Scan(&dir); err == nil {
			pidFile = filepath.Join(dir, "postmaster.pid")
		}
	case registry.MySQL:
		_ = db.DB.QueryRowContext(ctx, `SELECT @@pid_file`).Scan(&pidFile)
	}
	if pidFile != "" {
		t.pid = readPID(pidFile)
		if _, err := procstat.Read(t.pid); t.pid != 0 && err != nil {
			t.pid = 0
		}
		if t.pid == 0 {
			fmt.Fprintf(b.e.stderr, "%s: no server process found from %s: its CPU is not measured\n", db.Redacted(), pidFile)
		}
	}
	return nil
}

func (b *benchDrain) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, t := range b.targets {
		db := t.db
		if q := drainSQL[db.Dialect].drop; q != "" {
			quote := postgres.QuoteIdent
			if db.Dialect == registry.MySQL {
				quote = mysql.QuoteIdent
			}
			if _, err := db.DB.ExecContext(ctx, fmt.Sprintf(q, quote(b.name))); err != nil {
				fmt.Fprintf(b.e.stderr, "remove %s on %s: %v\n", b.name, db.Redacted(), err)
			}
		}
		db.Close()
		if db.File != "" {
			for _, suffix := range []string{"", "-wal", "-shm"} {
				_ = os.Remove(db.File + suffix)
			}
		}
	}
}

// fill empties the outbox of db and commits b.rows events over aggregates
// aggregates, row i in aggregate i mod aggregates, then updates the
// table's statistics.
func (b *benchDrain) fill(ctx context.Context, db *registry.Database, aggregates int) error {
	q := drainSQL[db.Dialect]
	if _, err := db.DB.ExecContext(ctx, q.empty); err != nil {
		return fmt.Errorf("empty the outbox: %w", err)
	}
	w := outbox.NewWriter(db.SQL)
	for start := 0; start < b.rows; start += 1000 {
		evs := make([]idemmsg.Event, 0, 1000)
		for i := start; i < min(start+1000, b.rows); i++ {
			agg := strconv.Itoa(i % aggregates)
			ev, err := idemmsg.NewEvent("order.order.changed.v1", "order", agg,
				map[string]any{"order_id": agg, "lines": 3, "total_cents": 4299, "currency": "EUR"})
			if err != nil {
				return err
			}
			ev.AggregateVersion = int64(i/aggregates + 1)
			evs = append(evs, ev)
		}
		if err := inTx(ctx, db.DB, func(tx *sql.Tx) error { return w.Add(ctx, tx, evs...) }); err != nil {
			return fmt.Errorf("fill the outbox: %w", err)
		}
	}
	rows, err := db.DB.QueryContext(ctx, q.analyze)
	if err != nil {
		return fmt.Errorf("%s: %w", q.analyze, err)
	}
	return rows.Close()
}

// drain fills the outbox of t with b.rows rows over aggregates aggregates
// and times the relay draining it.
func (b *benchDrain) drain(ctx context.Context, t *drainTarget, aggregates, run int) (drainRun, error) {
	if err := b.fill(ctx, t.db, aggregates); err != nil {
		return drainRun{}, err
	}
	pub := &countingPublisher{next: b.pub}
	r, err := t.db.NewRelay(ctx, pub, relay.Config{
		Workers:       b.o.workers,
		BatchSize:     b.o.batch,
		StatsInterval: -1,
		Retention:     -1,
		Logger:        b.log,
	})
	if err != nil {
		return drainRun{}, err
	}
	if path := b.o.binlog.cpuProfile; path != "" {
		stop, err := startCPUProfile(fmt.Sprintf("%s.%s.%d.%d", path, t.db.Dialect, aggregates, run))
		if err != nil {
			return drainRun{}, err
		}
		defer stop()
	}
	warnings := b.warnings.Load()
	relayBefore, serverBefore, machineBefore := b.cpu(t)
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		return drainRun{}, err
	}
	defer func() { _ = r.Stop(context.Background()) }()
	deadline := start.Add(b.o.drain.timeout)
	for r.Stats().Published < int64(b.rows) {
		if ctx.Err() != nil {
			return drainRun{}, ctx.Err()
		}
		if time.Now().After(deadline) {
			return drainRun{}, fmt.Errorf("%s, %d aggregates: %d of %d rows published after %v (relay: %+v)",
				t.db.Dialect, aggregates, r.Stats().Published, b.rows, b.o.drain.timeout, r.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	if err := r.Stop(ctx); err != nil {
		return drainRun{}, fmt.Errorf("stop: %w", err)
	}
	relayAfter, serverAfter, machineAfter := b.cpu(t)
	s := r.Stats()
	return drainRun{
		rate:        float64(b.rows) / elapsed.Seconds(),
		relayCPU:    relayAfter - relayBefore,
		serverCPU:   serverAfter - serverBefore,
		serverKnown: t.pid != 0 && serverAfter >= serverBefore,
		cores:       machineBefore.CoresBusy(machineAfter),
		takeovers:   s.Takeovers,
		released:    s.Released,
		lostMark:    s.LeasesLost,
		warnings:    b.warnings.Load() - warnings,
	}, nil
}

// cpu reads the CPU time of this process, of t's server (0 when unknown)
// and of the machine.
func (b *benchDrain) cpu(t *drainTarget) (self, server time.Duration, machine procstat.Machine) {
	if p, err := procstat.Read(os.Getpid()); err == nil {
		self = p.Own
	}
	if t.pid != 0 {
		server, _ = procstat.TreeCPU(t.pid)
	}
	machine, _ = procstat.ReadMachine()
	return self, server, machine
}

// perThousand formats d as ms per 1,000 events of a drain.
func (b *benchDrain) perThousand(d time.Duration) float64 {
	return float64(d.Microseconds()) / float64(b.rows)
}

func (b *benchDrain) run(ctx context.Context) error {
	out := b.e.stdout
	to := "an in-process publisher"
	if b.pub != nil {
		to = b.brokerURL
	}
	fmt.Fprintf(out, "bench drain: %d rows over %s aggregates, %d workers, batch %d, %d interleaved runs; publishing to %s; scratch %s\n",
		b.rows, b.o.drain.aggregates, b.o.workers, b.o.batch, b.o.runs, to, b.name)
	for _, t := range b.targets {
		server := "not measured"
		switch {
		case t.db.Dialect == registry.SQLite:
			server = "in this process"
		case t.pid != 0:
			server = fmt.Sprintf("process %d and its children", t.pid)
		}
		fmt.Fprintf(out, "  %s: %s; server CPU: %s\n", t.db.Dialect, t.db.Redacted(), server)
	}
	fmt.Fprintln(out, "per drain: events/s [CPU ms per 1,000 events: this process/server (?: restarted); cores busy; takeovers/released/lost marks; warnings]")
	results := make([][][]drainRun, len(b.targets))
	for i := range results {
		results[i] = make([][]drainRun, len(b.aggregates))
	}
	for run := 1; run <= b.o.runs; run++ {
		for i, t := range b.targets {
			line := fmt.Sprintf("  run %d %-8s", run, t.db.Dialect)
			for j, aggs := range b.aggregates {
				r, err := b.drain(ctx, t, aggs, run)
				if err != nil {
					return err
				}
				results[i][j] = append(results[i][j], r)
				server := "-"
				switch {
				case r.serverKnown:
					server = fmt.Sprintf("%.0f", b.perThousand(r.serverCPU))
				case t.pid != 0:
					server = "?" // restarted during the drain
				}
				line += fmt.Sprintf("  %d agg: %.0f [%.0f/%s; %.1f; %d/%d/%d; %d]", aggs, r.rate,
					b.perThousand(r.relayCPU), server, r.cores, r.takeovers, r.released, r.lostMark, r.warnings)
			}
			fmt.Fprintln(out, line)
		}
	}
	fmt.Fprintln(out, "medians:")
	for i, t := range b.targets {
		for j, aggs := range b.aggregates {
			rs := results[i][j]
			pick := func(f func(drainRun) float64) float64 {
				v := make([]float64, len(rs))
				for k, r := range rs {
					v[k] = f(r)
				}
				return median(v)
			}
			var takeovers, released, lost int64
			for _, r := range rs {
				takeovers += r.takeovers
				released += r.released
				lost += r.lostMark
			}
			server := "-"
			var known []float64
			for _, r := range rs {
				if r.serverKnown {
					known = append(known, b.perThousand(r.serverCPU))
				}
			}
			if len(known) > 0 {
				server = fmt.Sprintf("%.0f", median(known))
			}
			fmt.Fprintf(out, "  %-8s %6d aggregates: %8.0f events/s  CPU ms per 1,000 events: this process %.0f, server %s  cores busy %.1f  takeovers %d, released %d, lost marks %d (all runs)\n",
				t.db.Dialect, aggs, pick(func(r drainRun) float64 { return r.rate }),
				pick(func(r drainRun) float64 { return b.perThousand(r.relayCPU) }), server,
				pick(func(r drainRun) float64 { return r.cores }), takeovers, released, lost)
		}
		if len(b.aggregates) > 1 {
			first, last := results[i][0], results[i][len(b.aggregates)-1]
			per := make([]string, len(first))
			firstRates, lastRates := make([]float64, len(first)), make([]float64, len(last))
			for k := range first {
				firstRates[k], lastRates[k] = first[k].rate, last[k].rate
				per[k] = fmt.Sprintf("%.2f", last[k].rate/first[k].rate)
			}
			fmt.Fprintf(out, "  %-8s %d / %d aggregates: %.2f of the medians (per run %s)\n", t.db.Dialect,
				b.aggregates[len(b.aggregates)-1], b.aggregates[0], median(lastRates)/median(firstRates), strings.Join(per, ", "))
		}
	}
	if n := b.warnings.Load(); n > 0 {
		fmt.Fprintf(out, "the relays logged %d warnings or errors (on the standard error)\n", n)
	}
	return nil
}
