package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/procstat"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/binlog"
	"github.com/idem-go/idem/relay/logrelay"
)

// binlogUsage is the part of the usage about "bench binlog".
const binlogUsage = `

  bench binlog --db mysql://... --broker amqp://... [--db-nobinlog mysql://...]
              [--rows N] [--aggregates N] [--runs N] [--clients N] [--commit-duration D]
              [--rates R,R] [--rate-duration D] [--db-pid PID] [--broker-pid PID]
              [--cpuprofile FILE]

Compares, in one run, on a scratch database idem_bench_binlog_<random> of
the MariaDB at --db (its binary log on, in row format with full rows and
metadata: what the binlog relay needs) and a scratch exchange and queue of
the RabbitMQ at --broker (all removed at the end), the binlog relay
(relay/binlog) with the polling relay on the same database and with
RabbitMQ's own speed:

  1. drain of --rows events (50,000 unless given; over --aggregates
     aggregates, committed in transactions of 1,000 while no relay runs) to
     RabbitMQ by (a) the binlog relay, reading them from the binary log (it
     stored its position on the empty outbox first, was stopped, then
     started again once they were committed), (b) the polling relay
     (relay.New on the mysql driver, its defaults), (c) a raw amqp091-go
     publisher with confirms, --cdc-window messages in flight, sending the
     same messages with the properties idem's publisher sets; events/s
     until the queue holds them all, (a) as a ratio to (b) and to (c), and
     CPU ms per 1,000 events, from the start to the relay's Stop, of this
     process (the relay, or the raw publisher), MariaDB (--db-pid, default
     the pid in the server's @@pid_file) and RabbitMQ (--broker-pid,
     default the pid in $IDEM_TEST_DIR/rabbitmq/rabbitmq.pid); the three
     alternate --runs times and medians are reported. --cpuprofile FILE
     writes a CPU profile of this process during each drain of (a)
     (FILE.1, FILE.2... with several runs);
  2. commit-to-receipt latency at each of --rates events/s (1000 unless
     given) for --rate-duration, one event per transaction from 16 clients
     (commit: when Commit returned; receipt: a consumer of the queue; after
     a second at the rate that is not counted), through the binlog relay
     and through the polling relay; for the binlog relay, its stages
     (logrelay.Stages: receive, visible, queue, confirm), p50 and p99 of each,
     receive being from the binlog's commit timestamp, whose resolution is
     one second: read-to-confirm (visible + queue + confirm) is exact;
  3. producer commits/s, --clients clients for --commit-duration each, one
     outbox row per transaction, no relay running, on --db and, with
     --db-nobinlog, on a MariaDB running without the binary log (a scratch
     database there too): what the binary log costs the writers, as a
     ratio; the two alternate --runs times and medians are reported.

The relays' warnings and errors are written to the standard error.
`

// binlogFlags are the flags of "bench binlog" alone.
type binlogFlags struct {
	noBinlogURL string
	dbPID       int
	brokerPID   int
	cpuProfile  string
}

func (f *binlogFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.noBinlogURL, "db-nobinlog", "", "bench binlog: a MariaDB running without the binary log, to compare the producers' commits/s with (mysql://...)")
	fs.IntVar(&f.dbPID, "db-pid", 0, "bench binlog: process id of --db's server, for its CPU (default: from its @@pid_file)")
	fs.IntVar(&f.brokerPID, "broker-pid", 0, "bench binlog: process id of RabbitMQ's beam.smp, for its CPU (default: from $IDEM_TEST_DIR/rabbitmq/rabbitmq.pid)")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "bench binlog: write a CPU profile of each drain by the binlog relay to this file; bench drain: of each drain (FILE.<dialect>.<aggregates>.<run>)")
}

// benchBinlog is one run of "bench binlog".
type benchBinlog struct {
	e                      *env
	o                      *options
	rows, aggregates, runs int
	// q holds the scratch exchange and queue, the raw publisher and the
	// events: the parts of "bench cdc" that do not depend on the database.
	q        *benchCDC
	name     string             // the scratch databases' name
	db       *registry.Database // the scratch database on --db
	noBinlog *registry.Database // the one on --db-nobinlog, or nil
	version  string
	log      *slog.Logger
	logged   *atomic.Int64 // warnings and errors the relays logged
	dbPID    int
	brokPID  int
}

// runBenchBinlog runs "bench binlog".
func runBenchBinlog(ctx context.Context, e *env, o *options) error {
	f := &o.cdc
	if !o.set["rows"] {
		o.rows = 50_000
	}
	if !o.set["rates"] {
		f.rates = "1000"
	}
	if o.rows <= 0 || o.aggregates <= 0 || o.runs <= 0 || f.clients <= 0 || f.window <= 0 {
		return usagef("--rows, --aggregates, --runs, --clients and --cdc-window must be positive")
	}
	rates, err := parseRates(f.rates)
	if err != nil {
		return err
	}
	amqpURL := f.broker.Resolve(e.getenv)
	if !strings.HasPrefix(amqpURL, "amqp://") && !strings.HasPrefix(amqpURL, "amqps://") {
		return usagef("bench binlog measures against RabbitMQ: --broker amqp://user:pass@host:5672/ (got %q)", redactedOrEmpty(amqpURL))
	}
	dbURL, _ := o.db.Resolve(e.getenv)
	if !strings.HasPrefix(dbURL, "mysql://") {
		return usagef("bench binlog needs MariaDB: --db mysql://user:pass@host:3306/db (got %q)", redactedOrEmpty(dbURL))
	}
	if u := o.binlog.noBinlogURL; u != "" && !strings.HasPrefix(u, "mysql://") {
		return usagef("--db-nobinlog: want mysql://user:pass@host:3306/db (got %q)", redactedOrEmpty(u))
	}
	logged := &atomic.Int64{}
	b := &benchBinlog{e: e, o: o, rows: o.rows, aggregates: o.aggregates, runs: o.runs, logged: logged,
		log: slog.New(&countingHandler{next: slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), n: logged})}
	b.q = &benchCDC{e: e, f: f, rows: b.rows, aggregates: b.aggregates, runs: b.runs, amqpURL: amqpURL, log: b.log}
	err = b.setup(ctx, dbURL)
	if err == nil {
		err = b.run(ctx, rates)
	}
	b.teardown()
	if n := logged.Load(); n > 0 {
		fmt.Fprintf(e.stdout, "the relays logged %d warnings or errors (on the standard error)\n", n)
	}
	return err
}

// countingHandler counts the records it passes on.
type countingHandler struct {
	next slog.Handler
	n    *atomic.Int64
}

func (h *countingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *countingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.n.Add(1)
	return h.next.Handle(ctx, r)
}

func (h *countingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &countingHandler{next: h.next.WithAttrs(attrs), n: h.n}
}

func (h *countingHandler) WithGroup(name string) slog.Handler {
	return &countingHandler{next: h.next.WithGroup(name), n: h.n}
}

func (b *benchBinlog) setup(ctx context.Context, dbURL string) error {
	raw := make([]byte, 4)
	_, _ = rand.Read(raw)
	suffix := hex.EncodeToString(raw)
	b.name = "idem_bench_binlog_" + suffix
	open := func(u string) (*registry.Database, error) {
		db, err := registry.OpenDatabase(ctx, u, registry.DatabaseOptions{Name: b.name, MaxConns: b.q.f.clients + 8})
		if err != nil {
			return nil, err
		}
		if _, err := migrate.New(db.SQL).Up(ctx); err != nil {
			db.Close()
			return nil, fmt.Errorf("migrate %s: %w", db.Redacted(), err)
		}
		return db, nil
	}
	var err error
	if b.db, err = open(dbURL); err != nil {
		return err
	}
	var logBin int
	var format, image string
	if err := b.db.DB.QueryRowContext(ctx, `SELECT @@log_bin, @@binlog_format, @@binlog_row_image, VERSION()`).Scan(&logBin, &format, &image, &b.version); err != nil {
		return err
	}
	if logBin != 1 || format != "ROW" || image != "FULL" {
		return fmt.Errorf("--db %s: log_bin=%d binlog_format=%s binlog_row_image=%s; the binlog relay needs the binary log on, in ROW format, with FULL rows", b.db.Redacted(), logBin, format, image)
	}
	if u := b.o.binlog.noBinlogURL; u != "" {
		if b.noBinlog, err = open(u); err != nil {
			return fmt.Errorf("--db-nobinlog: %w", err)
		}
		if err := b.noBinlog.DB.QueryRowContext(ctx, `SELECT @@log_bin`).Scan(&logBin); err != nil {
			return err
		}
		if logBin != 0 {
			return fmt.Errorf("--db-nobinlog %s runs with the binary log on (log_bin=1): start a MariaDB without it (IDEM_TEST_MARIADB_BINLOG=0 scripts/test.sh)", b.noBinlog.Redacted())
		}
	}
	b.dbPID = b.o.binlog.dbPID
	if b.dbPID == 0 {
		var path string
		if err := b.db.DB.QueryRowContext(ctx, `SELECT @@pid_file`).Scan(&path); err == nil {
			b.dbPID = readPID(path)
		}
	}
	b.brokPID = b.o.binlog.brokerPID
	if b.brokPID == 0 {
		if dir := b.e.getenv("IDEM_TEST_DIR"); dir != "" {
			b.brokPID = readPID(filepath.Join(dir, "rabbitmq", "rabbitmq.pid"))
		}
	}
	for _, pid := range []*int{&b.dbPID, &b.brokPID} {
		if *pid != 0 {
			if _, err := procstat.Read(*pid); err != nil {
				fmt.Fprintf(b.e.stderr, "process %d: %v: its CPU is not measured\n", *pid, err)
				*pid = 0
			}
		}
	}
	return b.q.setupBroker(suffix)
}

// startCPUProfile writes a CPU profile of this process to the file at
// path until the function it returns is called.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// readPID returns the process id on the first line of the file at path
// (PostgreSQL's postmaster.pid has more), 0 when there is none.
func readPID(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0
	}
	return pid
}

func (b *benchBinlog) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, db := range []*registry.Database{b.db, b.noBinlog} {
		if db == nil {
			continue
		}
		if _, err := db.DB.ExecContext(ctx, "DROP DATABASE "+mysql.QuoteIdent(b.name)); err != nil {
			fmt.Fprintf(b.e.stderr, "drop database %s on %s: %v\n", b.name, db.Redacted(), err)
		}
		db.Close()
	}
	b.q.teardown()
}

// tables are the scratch outbox's tables.
func (b *benchBinlog) tables() idemmsg.Tables { return idemmsg.Tables{Schema: b.name} }

// drainResult is one drain: events/s, and the CPU time of this process,
// the database server and the broker.
type drainResult struct {
	rate float64
	cpu  [3]time.Duration
}

// cpuNames name drainResult.cpu.
var cpuNames = [3]string{"relay", "MariaDB", "RabbitMQ"}

// cpu reads the CPU time of this process, the database's and the broker's
// (0 for those not known).
func (b *benchBinlog) cpu() [3]time.Duration {
	var out [3]time.Duration
	if p, err := procstat.Read(os.Getpid()); err == nil {
		out[0] = p.Own
	}
	for i, pid := range []int{b.dbPID, b.brokPID} {
		if pid != 0 {
			out[i+1], _ = procstat.TreeCPU(pid)
		}
	}
	return out
}

func (b *benchBinlog) run(ctx context.Context, rates []int) error {
	out := b.e.stdout
	fmt.Fprintf(out, "bench binlog: %d events over %d aggregates; MariaDB %s, database %s; RabbitMQ exchange %s; window %d\n",
		b.rows, b.aggregates, b.version, b.name, b.q.exchange, b.q.f.window)
	pids := fmt.Sprintf("relay: this process (%d)", os.Getpid())
	for i, pid := range []int{b.dbPID, b.brokPID} {
		if pid == 0 {
			pids += fmt.Sprintf(", %s: not measured", cpuNames[i+1])
		} else {
			pids += fmt.Sprintf(", %s: process %d and its children", cpuNames[i+1], pid)
		}
	}
	fmt.Fprintf(out, "CPU of %s\n", pids)

	names := []string{"(a) binlog relay", "(b) polling relay", "(c) raw amqp091-go, confirms"}
	drains := []func(run int) (drainResult, error){
		func(run int) (drainResult, error) { return b.drainBinlog(ctx, run) },
		func(int) (drainResult, error) { return b.drainPolling(ctx) },
		func(int) (drainResult, error) { return b.drainRaw(ctx) },
	}
	results := make([][]drainResult, len(drains))
	fmt.Fprintf(out, "drain of %d events to RabbitMQ, %d interleaved runs (events/s [CPU ms per 1,000 events: relay/MariaDB/RabbitMQ]):\n", b.rows, b.runs)
	for run := 1; run <= b.runs; run++ {
		line := fmt.Sprintf("  run %d:", run)
		for i, drain := range drains {
			r, err := drain(run)
			if err != nil {
				return fmt.Errorf("%s: %w", names[i], err)
			}
			results[i] = append(results[i], r)
			line += fmt.Sprintf("  %s %.0f [%s]", names[i][:3], r.rate, b.perThousand(r.cpu))
		}
		fmt.Fprintln(out, line)
	}
	medians := make([]float64, len(drains))
	for i := range drains {
		rates := make([]float64, len(results[i]))
		for j, r := range results[i] {
			rates[j] = r.rate
		}
		medians[i] = median(rates)
	}
	for i, name := range names {
		ratios := ""
		if i == 0 {
			ratios = fmt.Sprintf("   %.2f of polling   %.2f of raw", medians[0]/medians[1], medians[0]/medians[2])
		}
		fmt.Fprintf(out, "  %-30s median %8.0f events/s%s\n", name, medians[i], ratios)
		fmt.Fprintf(out, "  %-30s median CPU ms per 1,000 events: %s\n", "", b.cpuMedians(results[i]))
	}

	for _, rate := range rates {
		fmt.Fprintf(out, "latency at %d events/s for %v, one event per transaction (commit returned -> consumer receipt):\n", rate, b.q.f.rateFor)
		for _, polling := range []bool{false, true} {
			name := "binlog relay"
			if polling {
				name = "polling relay"
			}
			lat, stages, err := b.latency(ctx, rate, polling)
			if err != nil {
				return fmt.Errorf("latency at %d/s, %s: %w", rate, name, err)
			}
			fmt.Fprintf(out, "  %-14s commit-to-receipt p50 %v  p99 %v  max %v (%d events)\n",
				name, percentile(lat, 50), percentile(lat, 99), percentile(lat, 100), len(lat))
			if !polling {
				fmt.Fprintf(out, "  %-14s %s\n", "", binlogStagesLine(stages))
			}
		}
	}

	if !b.q.f.skipProducer {
		fmt.Fprintf(out, "producer commits/s, %d clients, one outbox row per transaction, %v each, no relay running, %d interleaved runs:\n",
			b.q.f.clients, b.q.f.commitFor, b.runs)
		var with, without []float64
		for run := 1; run <= b.runs; run++ {
			r, err := b.producers(ctx, b.db)
			if err != nil {
				return fmt.Errorf("producers, with the binary log: %w", err)
			}
			with = append(with, r)
			line := fmt.Sprintf("  run %d:  with binlog %.0f", run, r)
			if b.noBinlog != nil {
				r, err := b.producers(ctx, b.noBinlog)
				if err != nil {
					return fmt.Errorf("producers, without the binary log: %w", err)
				}
				without = append(without, r)
				line += fmt.Sprintf("  without binlog %.0f", r)
			}
			fmt.Fprintln(out, line)
		}
		if b.noBinlog == nil {
			fmt.Fprintf(out, "  %-24s median %8.0f commits/s (no --db-nobinlog to compare with)\n", "MariaDB with binlog", median(with))
		} else {
			fmt.Fprintf(out, "  %-24s median %8.0f commits/s   %.2f of without\n", "MariaDB with binlog", median(with), median(with)/median(without))
			fmt.Fprintf(out, "  %-24s median %8.0f commits/s\n", "MariaDB without binlog", median(without))
		}
	}
	return nil
}

// perThousand formats CPU times as ms per 1,000 events of a drain.
func (b *benchBinlog) perThousand(cpu [3]time.Duration) string {
	parts := make([]string, len(cpu))
	for i, d := range cpu {
		if i > 0 && []int{b.dbPID, b.brokPID}[i-1] == 0 {
			parts[i] = "-"
			continue
		}
		parts[i] = fmt.Sprintf("%.0f", float64(d.Milliseconds())*1000/float64(b.rows))
	}
	return strings.Join(parts, "/")
}

// cpuMedians formats the median CPU ms per 1,000 events of each process.
func (b *benchBinlog) cpuMedians(rs []drainResult) string {
	var med [3]time.Duration
	for i := range med {
		v := make([]float64, len(rs))
		for j, r := range rs {
			v[j] = float64(r.cpu[i])
		}
		med[i] = time.Duration(median(v))
	}
	parts := strings.Split(b.perThousand(med), "/")
	for i := range parts {
		parts[i] = cpuNames[i] + " " + parts[i]
	}
	return strings.Join(parts, "  ")
}

// binlogStagesLine returns the p50 and p99 of each stage of the binlog
// relay's commit-to-confirmation time; receive starts at the binlog's
// commit timestamp, whose resolution is one second.
func binlogStagesLine(stages []logrelay.Stages) string {
	parts := []struct {
		name string
		get  func(logrelay.Stages) time.Duration
	}{
		{"read-to-confirm", func(s logrelay.Stages) time.Duration { return s.Visible + s.Queue + s.Confirm }},
		{"visible", func(s logrelay.Stages) time.Duration { return s.Visible }},
		{"queue", func(s logrelay.Stages) time.Duration { return s.Queue }},
		{"confirm", func(s logrelay.Stages) time.Duration { return s.Confirm }},
		{"receive (1 s resolution)", func(s logrelay.Stages) time.Duration { return s.Receive }},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "stages p50/p99 (%d messages):", len(stages))
	for _, part := range parts {
		d := make([]time.Duration, len(stages))
		for i, s := range stages {
			d[i] = part.get(s)
		}
		fmt.Fprintf(&sb, " %s %v/%v", part.name, percentile(d, 50), percentile(d, 99))
	}
	return sb.String()
}

// empty deletes every row of the scratch outbox, while no relay runs: a
// binlog relay started afterwards reads the binlog from after it.
func (b *benchBinlog) empty(ctx context.Context) error {
	_, err := b.db.DB.ExecContext(ctx, "TRUNCATE TABLE outbox")
	return err
}

// fill commits b.rows events in transactions of 1,000.
func (b *benchBinlog) fill(ctx context.Context) error {
	w := outbox.NewWriter(b.db.SQL)
	for start := 0; start < b.rows; start += 1000 {
		evs := make([]idemmsg.Event, 0, 1000)
		for i := start; i < min(b.rows, start+1000); i++ {
			evs = append(evs, b.q.event(i).Event)
		}
		if err := inTx(ctx, b.db.DB, func(tx *sql.Tx) error { return w.Add(ctx, tx, evs...) }); err != nil {
			return err
		}
	}
	return nil
}

// inTx runs f in a transaction of db and commits it.
func inTx(ctx context.Context, db *sql.DB, f func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// newBinlog returns a binlog relay on the scratch outbox.
func (b *benchBinlog) newBinlog(pub *amqp.Publisher, obs logrelay.Observer) (*binlog.Relay, error) {
	return binlog.New(b.db.URL, pub, binlog.Config{Tables: b.tables(), Window: b.q.f.window, Logger: b.log, Observer: obs})
}

// storePosition forgets the binlog relay's stored position, starts it on
// the empty outbox, has it publish one event (at a first start on a quiet
// server, the relay stores no position until a transaction moves it), and
// stops it once it has stored its position: the next start reads the
// binlog from there.
func (b *benchBinlog) storePosition(ctx context.Context, pub *amqp.Publisher) error {
	if err := binlog.ResetPosition(ctx, b.db.URL, b.tables()); err != nil {
		return err
	}
	r, err := b.newBinlog(pub, logrelay.Observer{})
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = r.Stop(context.Background()) }()
	stored := func() (bool, error) {
		var n int
		err := b.db.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM binlog_position WHERE outbox_table = 'outbox'`).Scan(&n)
		return n == 1, err
	}
	for deadline := time.Now().Add(time.Minute); !r.Stats().Streaming; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the binlog relay does not stream after a minute (last error: %q)", r.Stats().LastError)
		}
	}
	ev := b.q.event(b.rows).Event
	if err := outbox.NewWriter(b.db.SQL).AddExec(ctx, b.db.SQL.Pool(), ev); err != nil {
		return err
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		ok, err := stored()
		if err != nil {
			return err
		}
		if ok && r.Stats().Published > 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the binlog relay stored no position within a minute (stats: %+v)", r.Stats())
		}
	}
	if err := r.Stop(ctx); err != nil {
		return err
	}
	if ok, err := stored(); err != nil || !ok {
		return fmt.Errorf("the binlog relay stopped without a stored position (%v)", err)
	}
	var left int
	if err := b.db.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox`).Scan(&left); err != nil {
		return err
	}
	if left != 0 {
		return fmt.Errorf("the binlog relay stopped with %d rows left in the outbox, after publishing them", left)
	}
	return nil
}

// drainBinlog empties the outbox, has the binlog relay store its
// position, commits b.rows events while it is stopped, then times it
// reading them from the binlog.
func (b *benchBinlog) drainBinlog(ctx context.Context, run int) (drainResult, error) {
	if err := b.empty(ctx); err != nil {
		return drainResult{}, err
	}
	pub, err := b.q.publisher(ctx)
	if err != nil {
		return drainResult{}, err
	}
	defer pub.Close()
	if err := b.storePosition(ctx, pub); err != nil {
		return drainResult{}, err
	}
	if err := b.fill(ctx); err != nil {
		return drainResult{}, err
	}
	r, err := b.newBinlog(pub, logrelay.Observer{})
	if err != nil {
		return drainResult{}, err
	}
	defer func() { _ = r.Stop(context.Background()) }()
	if path := b.o.binlog.cpuProfile; path != "" {
		if b.runs > 1 {
			path = fmt.Sprintf("%s.%d", path, run)
		}
		stop, err := startCPUProfile(path)
		if err != nil {
			return drainResult{}, err
		}
		defer stop()
	}
	res, err := b.timeDrain(ctx, func() error { return r.Start(ctx) }, func() error { return r.Stop(ctx) })
	if err != nil {
		return res, fmt.Errorf("%w (relay: %+v)", err, r.Stats())
	}
	s := r.Stats()
	if s.Published != int64(b.rows) || s.PublishFailures != 0 || s.Unreadable != 0 || s.Quarantined != 0 || s.LastError != "" {
		fmt.Fprintf(b.e.stderr, "binlog relay, run %d: published %d of %d, %d failed calls of %d, %d unreadable, %d quarantined, %d deleted, last error %q\n",
			run, s.Published, b.rows, s.PublishFailures, s.PublishCalls, s.Unreadable, s.Quarantined, s.Deleted, s.LastError)
	}
	var left int
	if err := b.db.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox`).Scan(&left); err == nil && left != 0 {
		fmt.Fprintf(b.e.stderr, "binlog relay, run %d: %d published rows left in the outbox after Stop\n", run, left)
	}
	return res, nil
}

// drainPolling commits b.rows events, then times the polling relay
// draining them.
func (b *benchBinlog) drainPolling(ctx context.Context) (drainResult, error) {
	if err := b.empty(ctx); err != nil {
		return drainResult{}, err
	}
	if err := b.fill(ctx); err != nil {
		return drainResult{}, err
	}
	pub, err := b.q.publisher(ctx)
	if err != nil {
		return drainResult{}, err
	}
	defer pub.Close()
	r, err := relay.New(b.db.SQL, pub, relay.Config{StatsInterval: -1, Retention: -1, Logger: b.log})
	if err != nil {
		return drainResult{}, err
	}
	defer func() { _ = r.Stop(context.Background()) }()
	return b.timeDrain(ctx, func() error { return r.Start(ctx) }, func() error { return r.Stop(ctx) })
}

// drainRaw times the raw publisher sending the same messages.
func (b *benchBinlog) drainRaw(ctx context.Context) (drainResult, error) {
	msgs := b.q.messages()
	return b.timeDrain(ctx, func() error { return b.q.rawPublish(ctx, msgs) }, nil)
}

// timeDrain runs start and returns the events/s until the queue holds
// b.rows messages, and the CPU the processes spent from the start until
// stop (when set) returned.
func (b *benchBinlog) timeDrain(ctx context.Context, start, stop func() error) (drainResult, error) {
	before := b.cpu()
	rate, err := b.q.timeDrain(ctx, start)
	if err != nil {
		return drainResult{}, err
	}
	if stop != nil {
		if err := stop(); err != nil {
			return drainResult{}, fmt.Errorf("stop: %w", err)
		}
	}
	after := b.cpu()
	res := drainResult{rate: rate}
	for i := range res.cpu {
		res.cpu[i] = after[i] - before[i]
	}
	if n, err := b.q.queueDepth(); err == nil && n != b.rows {
		fmt.Fprintf(b.e.stderr, "the queue holds %d messages after a drain of %d (duplicates)\n", n, b.rows)
	}
	return res, nil
}

// latency commits events one per transaction at rate through the binlog
// relay (or the polling relay) and returns each one's time from its commit
// returning to its receipt by a consumer of the queue, and, for the binlog
// relay, each message's stages.
func (b *benchBinlog) latency(ctx context.Context, rate int, polling bool) ([]time.Duration, []logrelay.Stages, error) {
	if err := b.empty(ctx); err != nil {
		return nil, nil, err
	}
	if _, err := b.q.ch.QueuePurge(b.q.queue, false); err != nil {
		return nil, nil, err
	}
	rc, err := b.q.consume()
	if err != nil {
		return nil, nil, err
	}
	defer rc.close()
	pub, err := b.q.publisher(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer pub.Close()
	var mu sync.Mutex
	var stages []logrelay.Stages
	var r interface{ Stop(context.Context) error }
	if polling {
		pr, err := relay.New(b.db.SQL, pub, relay.Config{StatsInterval: -1, Retention: -1, Logger: b.log})
		if err != nil {
			return nil, nil, err
		}
		if err := pr.Start(ctx); err != nil {
			return nil, nil, err
		}
		r = pr
	} else {
		if err := binlog.ResetPosition(ctx, b.db.URL, b.tables()); err != nil {
			return nil, nil, err
		}
		br, err := b.newBinlog(pub, logrelay.Observer{Stages: func(s logrelay.Stages) {
			mu.Lock()
			stages = append(stages, s)
			mu.Unlock()
		}})
		if err != nil {
			return nil, nil, err
		}
		if err := br.Start(ctx); err != nil {
			return nil, nil, err
		}
		r = br
		for deadline := time.Now().Add(time.Minute); !br.Stats().Streaming; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				_ = br.Stop(ctx)
				return nil, nil, errors.New("the binlog relay does not stream after a minute")
			}
		}
	}
	defer func() { _ = r.Stop(context.Background()) }()

	w := outbox.NewWriter(b.db.SQL)
	total := int(b.q.f.rateFor.Seconds() * float64(rate))
	committed, err := warmThenCommit(rate, total, func(i int) (uuid.UUID, error) {
		ev := b.q.event(i).Event
		return ev.ID, inTx(ctx, b.db.DB, func(tx *sql.Tx) error { return w.Add(ctx, tx, ev) })
	}, rc.count, func() {
		mu.Lock()
		stages = stages[:0]
		mu.Unlock()
	})
	if err != nil {
		return nil, nil, err
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make([]time.Duration, 0, total)
	for id, c := range committed {
		at, ok := rc.at[id.String()]
		if !ok {
			return nil, nil, fmt.Errorf("event %s not received", id)
		}
		out = append(out, max(0, at.Sub(c)))
	}
	mu.Lock()
	defer mu.Unlock()
	return out, slices.Clone(stages), nil
}

// producers runs --clients clients committing one outbox row per
// transaction into db's scratch outbox for --commit-duration, and returns
// commits/s.
func (b *benchBinlog) producers(ctx context.Context, db *registry.Database) (float64, error) {
	if _, err := db.DB.ExecContext(ctx, "TRUNCATE TABLE outbox"); err != nil {
		return 0, err
	}
	w := outbox.NewWriter(db.SQL)
	var commits atomic.Int64
	stop := time.Now().Add(b.q.f.commitFor)
	errs := make(chan error, b.q.f.clients)
	var wg sync.WaitGroup
	t0 := time.Now()
	for c := range b.q.f.clients {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				ev := b.q.event(c*1_000_000 + i).Event
				if err := inTx(ctx, db.DB, func(tx *sql.Tx) error { return w.Add(ctx, tx, ev) }); err != nil {
					errs <- err
					return
				}
				commits.Add(1)
			}
		})
	}
	wg.Wait()
	d := time.Since(t0)
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(commits.Load()) / d.Seconds(), nil
}
