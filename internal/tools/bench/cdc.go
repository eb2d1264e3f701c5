package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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
	amqp091 "github.com/rabbitmq/amqp091-go"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/logrelay"
)

// cdcUsage is the part of the usage about "bench cdc".
const cdcUsage = `
  bench cdc [--db URL] --broker amqp://... [--rows N] [--aggregates N] [--runs N]
           [--clients N] [--commit-duration D] [--rates R,R] [--rate-duration D]

Compares, in one run, on a scratch schema and a scratch exchange and queue
of the RabbitMQ at --broker (both removed at the end; the slots it creates
are dropped), the CDC relay with the polling relay and with RabbitMQ's own
speed (the database must run with wal_level=logical):

  1. drain of --rows events (over --aggregates aggregates, committed in
     transactions of 1,000 before the relay starts) to RabbitMQ by (a) the
     CDC relay reading table rows, (b) the CDC relay reading WAL messages
     (outbox.NewLogWriter), (c) the polling relay, (d) a raw amqp091-go
     publisher with confirms, --cdc-window messages in flight, sending the
     same messages with the properties idem's publisher sets; events/s
     until the queue holds them all, and each as a ratio to (d); the four
     alternate --runs times and medians are reported;
  2. producer commits/s, --clients clients for --commit-duration each,
     one event per transaction: an insert into a plain table (the outbox's
     columns, a primary key, no trigger), into the outbox with its NOTIFY
     trigger, into the outbox with the trigger disabled (what the CDC relay
     needs), and a WAL message; each as a ratio to the plain insert; no relay
     runs;
  3. commit-to-receipt latency at each of --rates events/s for
     --rate-duration, events committed one per transaction by 16 clients
     and received by a consumer of the queue (p50, p99, max; after a
     second at the rate that is not counted), through, in turn: the CDC relay reading table rows (trigger disabled), the CDC
     relay reading WAL messages, and the polling relay with its defaults
     (the waiting trigger); for the CDC relays, the commit-to-confirmation
     time in its stages (logrelay.Stages: receive, visible, queue, confirm),
     p50 and p99 of each.
`

// cdcFlags are the flags of "bench cdc" that "bench relay" does not have
// (but --broker).
type cdcFlags struct {
	broker       registry.BrokerFlags
	clients      int
	commitFor    time.Duration
	rates        string
	rateFor      time.Duration
	window       int
	skipProducer bool
}

func (f *cdcFlags) register(fs *flag.FlagSet) {
	f.broker.Register(fs)
	fs.IntVar(&f.clients, "clients", 16, "bench cdc, binlog: producer clients")
	fs.DurationVar(&f.commitFor, "commit-duration", 5*time.Second, "bench cdc, binlog: how long each producer mode runs")
	fs.StringVar(&f.rates, "rates", "1000,5000", "bench cdc, binlog: events/s of the latency runs, comma-separated; empty skips them (bench binlog: 1000 unless given)")
	fs.DurationVar(&f.rateFor, "rate-duration", 10*time.Second, "bench cdc, binlog: length of each latency run")
	fs.IntVar(&f.window, "cdc-window", logrelay.WindowDefault, "bench cdc, binlog: messages in flight of the CDC or binlog relay and of the raw publisher")
	fs.BoolVar(&f.skipProducer, "skip-producers", false, "bench cdc, binlog: skip the producer commits/s part")
}

// benchCDC is one run of "bench cdc".
type benchCDC struct {
	e                      *env
	f                      *cdcFlags
	rows, aggregates, runs int
	dbURL                  string // the scratch schema's URL (search_path)
	admin, pool            *pgxpool.Pool
	schema                 string
	drv                    *postgres.PgxDriver
	amqpURL, exchange      string
	queue                  string
	conn                   *amqp091.Connection
	ch                     *amqp091.Channel
	log                    *slog.Logger
	slots                  []string
}

// runBenchCDC runs "bench cdc".
func runBenchCDC(ctx context.Context, e *env, o *options) error {
	f := &o.cdc
	if f.clients <= 0 || f.window <= 0 {
		return usagef("--clients and --cdc-window must be positive")
	}
	rates, err := parseRates(f.rates)
	if err != nil {
		return err
	}
	amqpURL := f.broker.Resolve(e.getenv)
	if !strings.HasPrefix(amqpURL, "amqp://") && !strings.HasPrefix(amqpURL, "amqps://") {
		return usagef("bench cdc measures against RabbitMQ: --broker amqp://user:pass@host:5672/ (got %q)", redactedOrEmpty(amqpURL))
	}
	conn, err := o.db.Open(ctx, e.getenv)
	if err != nil {
		return err
	}
	defer conn.Close()
	if conn.Pgx == nil {
		return errors.New("bench cdc needs PostgreSQL (logical replication)")
	}
	b := &benchCDC{e: e, f: f, rows: o.rows, aggregates: o.aggregates, runs: o.runs, amqpURL: amqpURL,
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := b.setup(ctx, conn.Pgx.Pgx(), conn.URL); err != nil {
		b.teardown()
		return err
	}
	defer b.teardown()
	return b.run(ctx, rates)
}

func redactedOrEmpty(u string) string {
	if u == "" {
		return ""
	}
	return strings.SplitN(u, "@", 2)[len(strings.SplitN(u, "@", 2))-1]
}

func parseRates(s string) ([]int, error) {
	var out []int
	for _, r := range strings.Split(s, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		n, err := strconv.Atoi(r)
		if err != nil || n <= 0 {
			return nil, usagef("--rates %q: want positive events/s, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func (b *benchCDC) setup(ctx context.Context, base *pgxpool.Pool, baseURL string) error {
	raw := make([]byte, 4)
	_, _ = rand.Read(raw)
	suffix := hex.EncodeToString(raw)
	b.schema = "idem_bench_cdc_" + suffix
	b.admin = base
	var level string
	if err := base.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return err
	}
	if level != "logical" {
		return fmt.Errorf("the server runs with wal_level=%s; the CDC relay needs wal_level=logical (ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL)", level)
	}
	if _, err := base.Exec(ctx, "CREATE SCHEMA "+postgres.QuoteIdent(b.schema)); err != nil {
		return err
	}
	cfg := base.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = b.schema
	cfg.MaxConns = int32(b.f.clients) + 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	b.pool = pool
	b.dbURL = baseURL
	b.drv = postgres.NewPgx(pool)
	if _, err := migrate.New(b.drv).Up(ctx); err != nil {
		return err
	}
	// The plain table: the outbox's columns and defaults, a primary key,
	// nothing else.
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_plain (LIKE outbox INCLUDING DEFAULTS INCLUDING IDENTITY, PRIMARY KEY (id))`); err != nil {
		return fmt.Errorf("plain table: %w", err)
	}

	return b.setupBroker(suffix)
}

// setupBroker declares the scratch exchange idem_bench_<suffix> and its
// queue, bound with the routing key #.
func (b *benchCDC) setupBroker(suffix string) error {
	b.exchange = "idem_bench_" + suffix
	b.queue = b.exchange + ".all"
	var err error
	if b.conn, err = amqp091.Dial(b.amqpURL); err != nil {
		return fmt.Errorf("RabbitMQ %s: %w", redactedOrEmpty(b.amqpURL), err)
	}
	if b.ch, err = b.conn.Channel(); err != nil {
		return err
	}
	if err := b.ch.ExchangeDeclare(b.exchange, "topic", true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := b.ch.QueueDeclare(b.queue, true, false, false, false, amqp091.Table{"x-queue-version": int32(2)}); err != nil {
		return err
	}
	return b.ch.QueueBind(b.queue, "#", b.exchange, false, nil)
}

func (b *benchCDC) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range b.slots {
		if err := cdc.DropSlot(ctx, b.dbURL, s); err != nil {
			fmt.Fprintf(b.e.stderr, "drop slot %s: %v\n", s, err)
		}
		if b.admin != nil {
			_, _ = b.admin.Exec(ctx, "DROP PUBLICATION IF EXISTS "+postgres.QuoteIdent(s))
		}
	}
	if b.pool != nil {
		b.pool.Close()
	}
	if b.schema != "" && b.admin != nil {
		if _, err := b.admin.Exec(ctx, "DROP SCHEMA "+postgres.QuoteIdent(b.schema)+" CASCADE"); err != nil {
			fmt.Fprintf(b.e.stderr, "drop schema %s: %v\n", b.schema, err)
		}
	}
	if b.ch != nil {
		_, _ = b.ch.QueueDelete(b.queue, false, false, false)
		_ = b.ch.ExchangeDelete(b.exchange, false, false)
	}
	if b.conn != nil {
		_ = b.conn.Close()
	}
}

func (b *benchCDC) run(ctx context.Context, rates []int) error {
	out := b.e.stdout
	fmt.Fprintf(out, "bench cdc: %d events over %d aggregates; RabbitMQ exchange %s; window %d\n", b.rows, b.aggregates, b.exchange, b.f.window)

	names := []string{"(a) CDC relay, table rows", "(b) CDC relay, WAL messages", "(c) polling relay", "(d) raw amqp091-go, confirms"}
	drains := []func() (float64, error){
		func() (float64, error) { return b.drainCDC(ctx, false) },
		func() (float64, error) { return b.drainCDC(ctx, true) },
		func() (float64, error) { return b.drainPolling(ctx) },
		func() (float64, error) {
			msgs := b.messages()
			return b.timeDrain(ctx, func() error { return b.rawPublish(ctx, msgs) })
		},
	}
	drained := make([][]float64, len(drains))
	fmt.Fprintf(out, "drain of %d events to RabbitMQ, %d interleaved runs (events/s, and ratio to raw in the same run):\n", b.rows, b.runs)
	for run := 1; run <= b.runs; run++ {
		line := fmt.Sprintf("  run %d:", run)
		for i, drain := range drains {
			r, err := drain()
			if err != nil {
				return fmt.Errorf("%s: %w", names[i], err)
			}
			drained[i] = append(drained[i], r)
		}
		raw := drained[3][run-1]
		for i := range drains {
			line += fmt.Sprintf("  %s %.0f (%.2f)", names[i][:3], drained[i][run-1], drained[i][run-1]/raw)
		}
		fmt.Fprintln(out, line)
	}
	rawMedian := median(drained[3])
	for i, name := range names {
		fmt.Fprintf(out, "  %-30s median %8.0f events/s   %.2f of raw\n", name, median(drained[i]), median(drained[i])/rawMedian)
	}

	if !b.f.skipProducer {
		fmt.Fprintf(out, "producer commits/s, %d clients, one event per transaction, %v each:\n", b.f.clients, b.f.commitFor)
		var plain float64
		for _, m := range []struct {
			name      string
			table     string
			noTrigger bool
			log       bool
		}{{"plain insert, no trigger", "bench_plain", false, false}, {"outbox with NOTIFY trigger", "outbox", false, false},
			{"outbox without trigger (CDC)", "outbox", true, false}, {"WAL message (CDC)", "", false, true}} {
			if err := b.notifyTrigger(ctx, !m.noTrigger); err != nil {
				return err
			}
			r, err := b.producers(ctx, m.table, m.log)
			if err != nil {
				return fmt.Errorf("producers, %s: %w", m.name, err)
			}
			if plain == 0 {
				plain = r
			}
			fmt.Fprintf(out, "  %-30s %8.0f commits/s   %.2f of plain\n", m.name, r, r/plain)
		}
	}

	for _, rate := range rates {
		fmt.Fprintf(out, "latency at %d events/s for %v, one event per transaction:\n", rate, b.f.rateFor)
		for _, m := range latencyModes {
			lat, stages, err := b.latency(ctx, rate, m)
			if err != nil {
				return fmt.Errorf("latency at %d/s, %s: %w", rate, m, err)
			}
			fmt.Fprintf(out, "  %-22s commit-to-receipt p50 %v  p99 %v  max %v (%d events)\n",
				m, percentile(lat, 50), percentile(lat, 99), percentile(lat, 100), len(lat))
			if len(stages) > 0 {
				fmt.Fprintf(out, "  %-22s %s\n", "", stagesLine(stages))
			}
		}
	}
	return nil
}

// latencyMode is a relay the latency runs measure.
type latencyMode string

const (
	cdcRows    latencyMode = "CDC relay, table rows"
	cdcLog     latencyMode = "CDC relay, WAL messages"
	pollingRun latencyMode = "polling relay"
)

var latencyModes = []latencyMode{cdcRows, cdcLog, pollingRun}

// stagesLine returns the p50 and p99 of each stage of a CDC relay's
// commit-to-confirmation time, and of their sum.
func stagesLine(stages []logrelay.Stages) string {
	parts := []struct {
		name string
		get  func(logrelay.Stages) time.Duration
	}{
		{"commit-to-confirm", func(s logrelay.Stages) time.Duration { return s.Receive + s.Visible + s.Queue + s.Confirm }},
		{"receive", func(s logrelay.Stages) time.Duration { return s.Receive }},
		{"visible", func(s logrelay.Stages) time.Duration { return s.Visible }},
		{"queue", func(s logrelay.Stages) time.Duration { return s.Queue }},
		{"confirm", func(s logrelay.Stages) time.Duration { return s.Confirm }},
	}
	var b strings.Builder
	b.WriteString("p50/p99:")
	for _, part := range parts {
		d := make([]time.Duration, len(stages))
		for i, s := range stages {
			d[i] = part.get(s)
		}
		fmt.Fprintf(&b, " %s %v/%v", part.name, percentile(d, 50), percentile(d, 99))
	}
	return b.String()
}

// prefix is the prefix of the bench's WAL messages: its own, since every
// slot of the database reads every WAL message.
func (b *benchCDC) prefix() string { return outbox.LogPrefix(idemmsg.Tables{Schema: b.schema}) }

// notifyTrigger enables or disables the outbox's NOTIFY trigger.
func (b *benchCDC) notifyTrigger(ctx context.Context, on bool) error {
	what := "DISABLE"
	if on {
		what = "ENABLE"
	}
	_, err := b.pool.Exec(ctx, "ALTER TABLE outbox "+what+" TRIGGER USER")
	return err
}

// messages are the events of the drains, as the outbox would publish them.
func (b *benchCDC) messages() []idemmsg.Message {
	out := make([]idemmsg.Message, b.rows)
	for i := range out {
		out[i] = b.event(i).message()
	}
	return out
}

type benchEvent struct{ idemmsg.Event }

func (ev benchEvent) message() idemmsg.Message {
	m, err := idemmsg.NewMessage(ev.Event)
	if err != nil {
		panic(err)
	}
	return m
}

func (b *benchCDC) event(i int) benchEvent {
	agg := i % b.aggregates
	ev := idemmsg.Event{
		ID: idemmsg.NewEventID(), Name: "order.order.changed.v1", OccurredAt: time.Now().UTC(),
		AggregateType: "order", AggregateID: strconv.Itoa(agg), AggregateVersion: int64(i/b.aggregates + 1),
		Payload: []byte(fmt.Sprintf(`{"order_id":%d,"lines":3,"total_cents":4299,"currency":"EUR"}`, agg)),
	}
	return benchEvent{ev}
}

// queueDepth is the number of messages in the bench's queue.
func (b *benchCDC) queueDepth() (int, error) {
	q, err := b.ch.QueueDeclarePassive(b.queue, true, false, false, false, amqp091.Table{"x-queue-version": int32(2)})
	return q.Messages, err
}

// timeDrain purges the queue, runs start, and returns the events/s until
// the queue holds b.rows messages.
func (b *benchCDC) timeDrain(ctx context.Context, start func() error) (float64, error) {
	if _, err := b.ch.QueuePurge(b.queue, false); err != nil {
		return 0, err
	}
	t0 := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- start() }()
	for {
		n, err := b.queueDepth()
		if err != nil {
			return 0, err
		}
		if n >= b.rows {
			return float64(b.rows) / time.Since(t0).Seconds(), nil
		}
		select {
		case err := <-errc:
			if err != nil {
				return 0, err
			}
			errc = nil
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if time.Since(t0) > 10*time.Minute {
			return 0, fmt.Errorf("%d of %d messages in the queue after 10 minutes", n, b.rows)
		}
	}
}

// rawPublish publishes msgs with amqp091-go alone on one confirm channel,
// window in flight, with the properties broker/amqp sets: persistent,
// mandatory, message_id, type, content type, the key header.
func (b *benchCDC) rawPublish(ctx context.Context, msgs []idemmsg.Message) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	window := b.f.window
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, window))
	inflight := 0
	for _, m := range msgs {
		for inflight >= window {
			if c := <-confirms; !c.Ack {
				return errors.New("nack")
			}
			inflight--
		}
		pub := amqp091.Publishing{
			Headers: amqp091.Table{amqp.HeaderKey: string(m.Key)}, ContentType: idemmsg.ContentTypeJSON,
			DeliveryMode: amqp091.Persistent, Type: m.EventName, MessageId: m.EventID.String(), Body: m.Body,
		}
		if err := ch.PublishWithContext(ctx, b.exchange, m.EventName, true, false, pub); err != nil {
			return err
		}
		inflight++
	}
	for inflight > 0 {
		if c := <-confirms; !c.Ack {
			return errors.New("nack")
		}
		inflight--
	}
	return nil
}

// publisher opens idem's RabbitMQ publisher on the bench's exchange.
func (b *benchCDC) publisher(ctx context.Context) (*amqp.Publisher, error) {
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: b.amqpURL, ConnectionName: "idem bench cdc"}, Exchange: b.exchange})
	if err != nil {
		return nil, err
	}
	if err := p.Connect(ctx); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// newCDC returns a CDC relay on the bench's outbox with a fresh slot.
func (b *benchCDC) newCDC(pub *amqp.Publisher, slot string, obs logrelay.Observer) (*cdc.Relay, error) {
	return cdc.New(b.dbURL, pub, cdc.Config{
		Tables: idemmsg.Tables{Schema: b.schema}, Slot: slot, Publication: slot,
		Window: b.f.window, Logger: b.log, MessagePrefix: b.prefix(), Observer: obs,
	})
}

// drainCDC commits b.rows events while the relay's slot exists but nobody
// reads it, then times a relay draining them.
func (b *benchCDC) drainCDC(ctx context.Context, logMessages bool) (float64, error) {
	slot := fmt.Sprintf("%s_%d", b.schema, len(b.slots))
	b.slots = append(b.slots, slot)
	pub, err := b.publisher(ctx)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	r, err := b.newCDC(pub, slot, logrelay.Observer{})
	if err != nil {
		return 0, err
	}
	if err := r.Start(ctx); err != nil {
		return 0, err
	}
	if err := r.Stop(ctx); err != nil {
		return 0, err
	}
	if err := b.fill(ctx, logMessages); err != nil {
		return 0, err
	}
	if r, err = b.newCDC(pub, slot, logrelay.Observer{}); err != nil {
		return 0, err
	}
	defer func() { _ = r.Stop(context.Background()) }()
	return b.timeDrain(ctx, func() error { return r.Start(ctx) })
}

// drainPolling times the polling relay draining b.rows rows.
func (b *benchCDC) drainPolling(ctx context.Context) (float64, error) {
	if err := b.fill(ctx, false); err != nil {
		return 0, err
	}
	pub, err := b.publisher(ctx)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	r, err := relay.New(b.drv, pub, relay.Config{StatsInterval: -1, Retention: -1, Logger: b.log})
	if err != nil {
		return 0, err
	}
	defer func() { _ = r.Stop(context.Background()) }()
	return b.timeDrain(ctx, func() error { return r.Start(ctx) })
}

// fill empties the outbox and commits b.rows events in transactions of
// 1,000, as rows or as WAL messages.
func (b *benchCDC) fill(ctx context.Context, logMessages bool) error {
	if _, err := b.pool.Exec(ctx, "TRUNCATE outbox"); err != nil {
		return err
	}
	w := outbox.NewWriter(b.drv)
	if logMessages {
		var err error
		if w, err = outbox.NewLogWriter(b.drv, b.prefix()); err != nil {
			return err
		}
	}
	for start := 0; start < b.rows; start += 1000 {
		evs := make([]idemmsg.Event, 0, 1000)
		for i := start; i < min(b.rows, start+1000); i++ {
			evs = append(evs, b.event(i).Event)
		}
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return w.Add(ctx, tx, evs...) }); err != nil {
			return err
		}
	}
	return nil
}

// producers runs --clients clients committing one event per transaction
// into table (through outbox.Writer with that table), or as WAL messages,
// for --commit-duration, and returns commits/s.
func (b *benchCDC) producers(ctx context.Context, table string, logMessages bool) (float64, error) {
	var w *outbox.Writer[pgx.Tx]
	if logMessages {
		var err error
		if w, err = outbox.NewLogWriter(b.drv, b.prefix()); err != nil {
			return 0, err
		}
	} else {
		drv, err := postgres.NewPgxTables(b.pool, idemmsg.Tables{Outbox: table})
		if err != nil {
			return 0, err
		}
		w = outbox.NewWriter(drv)
		if _, err := b.pool.Exec(ctx, "TRUNCATE "+postgres.QuoteIdent(table)); err != nil {
			return 0, err
		}
	}
	var commits atomic.Int64
	stop := time.Now().Add(b.f.commitFor)
	errs := make(chan error, b.f.clients)
	var wg sync.WaitGroup
	t0 := time.Now()
	for c := range b.f.clients {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				ev := b.event(c*1_000_000 + i).Event
				if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return w.Add(ctx, tx, ev) }); err != nil {
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

// latency runs the CDC relay (table rows) and a consumer of the queue, and
// commits events one per transaction at rate for --rate-duration from 16
// producers; it returns each event's commit-to-receipt delay.
// latency commits events at rate through relay m and returns each one's
// time from its commit to its receipt by a consumer of the queue, and, for
// a CDC relay, each message's stages.
func (b *benchCDC) latency(ctx context.Context, rate int, m latencyMode) ([]time.Duration, []logrelay.Stages, error) {
	if _, err := b.pool.Exec(ctx, "TRUNCATE outbox"); err != nil {
		return nil, nil, err
	}
	if _, err := b.ch.QueuePurge(b.queue, false); err != nil {
		return nil, nil, err
	}
	rc, err := b.consume()
	if err != nil {
		return nil, nil, err
	}
	defer rc.close()
	mu, received := &rc.mu, rc.at

	pub, err := b.publisher(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer pub.Close()
	// The CDC relays need no wake-up: their producers commit without the
	// trigger, as they would in production; the polling relay runs as it
	// does by default, with the trigger that notifies while it waits.
	if err := b.notifyTrigger(ctx, m == pollingRun); err != nil {
		return nil, nil, err
	}
	w := outbox.NewWriter(b.drv)
	var stages []logrelay.Stages
	var r interface{ Stop(context.Context) error }
	switch m {
	case pollingRun:
		pr, err := relay.New(b.drv, pub, relay.Config{StatsInterval: -1, Retention: -1, Logger: b.log})
		if err != nil {
			return nil, nil, err
		}
		if err := pr.Start(ctx); err != nil {
			return nil, nil, err
		}
		r = pr
	default:
		if m == cdcLog {
			if w, err = outbox.NewLogWriter(b.drv, b.prefix()); err != nil {
				return nil, nil, err
			}
		}
		slot := fmt.Sprintf("%s_%d", b.schema, len(b.slots))
		b.slots = append(b.slots, slot)
		cr, err := b.newCDC(pub, slot, logrelay.Observer{Stages: func(s logrelay.Stages) {
			mu.Lock()
			stages = append(stages, s)
			mu.Unlock()
		}})
		if err != nil {
			return nil, nil, err
		}
		if err := cr.Start(ctx); err != nil {
			return nil, nil, err
		}
		r = cr
		// Measure the relay that streams, not its start: events committed
		// while it creates its slot wait for it.
		for deadline := time.Now().Add(time.Minute); !cr.Stats().Streaming; {
			if time.Now().After(deadline) {
				return nil, nil, errors.New("the CDC relay does not stream after a minute")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	defer func() { _ = r.Stop(context.Background()) }()

	total := int(b.f.rateFor.Seconds() * float64(rate))
	committed, err := warmThenCommit(rate, total, func(i int) (uuid.UUID, error) {
		ev := b.event(i).Event
		return ev.ID, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return w.Add(ctx, tx, ev) })
	}, func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(received)
	}, func() {
		mu.Lock()
		stages = stages[:0]
		mu.Unlock()
	})
	if err != nil {
		return nil, nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	out := make([]time.Duration, 0, total)
	for id, c := range committed {
		at, ok := received[id.String()]
		if !ok {
			return nil, nil, fmt.Errorf("event %s not received", id)
		}
		out = append(out, max(0, at.Sub(c)))
	}
	return out, slices.Clone(stages), nil
}

// receipts are the messages a consumer of the bench's queue received: each
// message id, with when it first arrived.
type receipts struct {
	mu       sync.Mutex
	at       map[string]time.Time
	ch       *amqp091.Channel
	consumed chan struct{}
}

// consume starts a consumer of the bench's queue (auto-ack) that records
// when each message arrives.
func (b *benchCDC) consume() (*receipts, error) {
	cch, err := b.conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := cch.Qos(2000, 0, false); err != nil {
		_ = cch.Close()
		return nil, err
	}
	deliveries, err := cch.Consume(b.queue, "", true, false, false, false, nil)
	if err != nil {
		_ = cch.Close()
		return nil, err
	}
	rc := &receipts{at: map[string]time.Time{}, ch: cch, consumed: make(chan struct{})}
	go func() {
		defer close(rc.consumed)
		for d := range deliveries {
			at := time.Now()
			rc.mu.Lock()
			if _, ok := rc.at[d.MessageId]; !ok {
				rc.at[d.MessageId] = at
			}
			rc.mu.Unlock()
		}
	}()
	return rc, nil
}

// count returns the number of distinct messages received.
func (rc *receipts) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.at)
}

// close stops the consumer and waits for its goroutine.
func (rc *receipts) close() {
	_ = rc.ch.Close()
	<-rc.consumed
}
