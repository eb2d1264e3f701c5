package inbox_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// The replica benchmarks run a consumer's replicas as processes of their
// own (this test binary re-executed, TestReplicaBenchChild), each an inbox
// consumer on PostgreSQL fed by NATS JetStream subscribers: with a
// partitioned stream, an inbox.Group over one subscriber per partition;
// unpartitioned, one subscriber. The NATS server is embedded in the
// benchmark's process and listens on a TCP port of 127.0.0.1. The handler
// sleeps (optionally) and inserts a row in bench_effect, stamped with the
// database's clock_timestamp(): durations are read from the database's
// clock, from a timestamp the benchmark takes to the last row applied.

// replicaChildEnv carries a replicaSpec in JSON to a child process.
const replicaChildEnv = "IDEM_BENCH_REPLICA_CHILD"

// benchPartitions is the partition count of the partitioned streams.
const benchPartitions = 6

// replicaSpec is what a replica process runs.
type replicaSpec struct {
	NATSURL     string            `json:"nats_url"`
	Stream      nats.StreamConfig `json:"stream"`
	Consumer    string            `json:"consumer"`
	PostgresURL string            `json:"postgres_url"`
	Member      string            `json:"member"`
	// MaxConns is the size of the replica's PostgreSQL pool; 0 is pgxpool's
	// default (4, or the number of CPUs above 4).
	MaxConns int32 `json:"max_conns"`
	// Sleep is how long the handler waits per event, in the transaction.
	Sleep time.Duration `json:"sleep"`
	// Workers is SubscriberConfig.Workers (0: the default, 2).
	Workers int `json:"workers"`
	// Gated holds the NATS subscribers back until the benchmark writes
	// "go" on the replica's standard input: the group settles first.
	Gated bool `json:"gated"`
}

const benchEffectDDL = `CREATE TABLE bench_effect (
    consumer     text NOT NULL,
    event_id     uuid NOT NULL,
    aggregate_id text NOT NULL,
    member       text NOT NULL,
    applied_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    tx           bigint NOT NULL DEFAULT txid_current(),
    PRIMARY KEY (consumer, event_id)
)`

// TestReplicaBenchChild is a replica of the replica benchmarks. It does
// nothing in a normal run.
func TestReplicaBenchChild(t *testing.T) {
	raw := os.Getenv(replicaChildEnv)
	if raw == "" {
		t.Skip("a child process of the replica benchmarks")
	}
	var spec replicaSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := pgxpool.ParseConfig(spec.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	if spec.MaxConns > 0 {
		cfg.MaxConns = spec.MaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := inbox.New(postgres.NewPgx(pool), inbox.Config{Name: spec.Consumer, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		if spec.Sleep > 0 {
			time.Sleep(spec.Sleep) // the I/O-bound downstream the benchmark stands for
		}
		_, err := tx.Exec(ctx, `INSERT INTO bench_effect (consumer, event_id, aggregate_id, member) VALUES ($1, $2, $3, $4)`,
			spec.Consumer, ev.ID, ev.AggregateID, spec.Member)
		return err
	})
	gate := make(chan struct{})
	if spec.Gated {
		go func() {
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				if sc.Text() == "go" {
					close(gate)
					return
				}
			}
		}()
	} else {
		close(gate)
	}
	newSub := func(p int) (broker.Subscriber, error) {
		return &gatedSub{gate: gate, log: log, cfg: nats.SubscriberConfig{
			ConnConfig: nats.ConnConfig{URL: spec.NATSURL, Logger: log},
			Stream:     spec.Stream, NoDeclare: true,
			Consumer: spec.Consumer, Partition: p, Workers: spec.Workers,
		}, deliver: c.DeliverBatch}, nil
	}
	var run interface {
		Start(context.Context) error
		Stop(context.Context) error
	}
	if spec.Stream.Partitions == 0 {
		run, _ = newSub(0)
	} else {
		run, err = inbox.NewGroup(c, inbox.GroupConfig{Partitions: spec.Stream.Partitions, MemberID: spec.Member,
			Subscriber: newSub, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := run.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The example database TestMain made for this process: the benchmark
	// drops it when it kills the process.
	u, _ := url.Parse(os.Getenv("DATABASE_URL"))
	fmt.Printf("ready %s\n", u.Query().Get("search_path"))
	<-ctx.Done()
	if err := run.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// gatedSub is a NATS subscriber that starts consuming once its gate is
// open.
type gatedSub struct {
	gate    <-chan struct{}
	log     *slog.Logger
	cfg     nats.SubscriberConfig
	deliver broker.DeliverFunc

	quit, done chan struct{}
	mu         sync.Mutex
	sub        *nats.Subscriber
}

func (g *gatedSub) Start(context.Context) error {
	g.quit, g.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(g.done)
		select {
		case <-g.gate:
		case <-g.quit:
			return
		}
		sub, err := nats.NewSubscriber(g.cfg, g.deliver)
		if err == nil {
			err = sub.Start(context.Background())
		}
		if err != nil {
			g.log.Error("replica bench: start subscriber", "partition", g.cfg.Partition, "error", err)
			return
		}
		g.mu.Lock()
		g.sub = sub
		g.mu.Unlock()
	}()
	return nil
}

func (g *gatedSub) Stop(ctx context.Context) error {
	close(g.quit)
	select {
	case <-g.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sub == nil {
		return nil
	}
	return g.sub.Stop(ctx)
}

// replicaRig is a benchmark's NATS server and database.
type replicaRig struct {
	b   *testing.B
	ctx context.Context
	srv *embedded.Server
	pg  *testdb.PG
}

func newReplicaRig(b *testing.B) *replicaRig {
	ctx := context.Background()
	srv, err := embedded.Start(ctx, embedded.Config{Dir: b.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	pg := testdb.NewPostgres(b)
	pg.Exec(b, benchEffectDDL)
	return &replicaRig{b: b, ctx: ctx, srv: srv, pg: pg}
}

// stream returns a fresh stream configuration (partitions: 0 or more)
// and a publisher that has created it.
func (r *replicaRig) stream(partitions int) (nats.StreamConfig, *nats.Publisher) {
	id := uuid.NewString()[:8]
	cfg := nats.StreamConfig{Name: "B" + id, SubjectPrefix: "b" + id, Partitions: partitions}
	pub, err := nats.NewPublisher(r.ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{URL: r.srv.ClientURL()}, Stream: cfg})
	if err != nil {
		r.b.Fatal(err)
	}
	r.b.Cleanup(func() { _ = pub.Close() })
	return cfg, pub
}

// publish publishes n events over aggregates aggregates, in order.
func (r *replicaRig) publish(pub *nats.Publisher, n, aggregates int) {
	msgs := make([]idem.Message, 0, n)
	for i := range n {
		ev, err := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprintf("o-%d", i%aggregates), map[string]int{"i": i})
		if err != nil {
			r.b.Fatal(err)
		}
		m, _ := idem.NewMessage(ev)
		msgs = append(msgs, m)
	}
	for i := 0; i < n; i += 1000 {
		if err := pub.Publish(r.ctx, msgs[i:min(i+1000, n)]); err != nil {
			r.b.Fatal(err)
		}
	}
}

// now returns the database's clock.
func (r *replicaRig) now() time.Time {
	var t time.Time
	if err := r.pg.Pool.QueryRow(r.ctx, `SELECT clock_timestamp()`).Scan(&t); err != nil {
		r.b.Fatal(err)
	}
	return t
}

// waitApplied waits until consumer has applied n events, and returns the
// time the last was applied.
func (r *replicaRig) waitApplied(consumer string, n int, timeout time.Duration) time.Time {
	deadline := time.Now().Add(timeout)
	for {
		var got int
		var last *time.Time
		if err := r.pg.Pool.QueryRow(r.ctx, `SELECT count(*), max(applied_at) FROM bench_effect WHERE consumer = $1`, consumer).Scan(&got, &last); err != nil {
			r.b.Fatal(err)
		}
		if got >= n {
			return *last
		}
		if time.Now().After(deadline) {
			r.b.Fatalf("consumer %s applied %d events of %d after %v", consumer, got, n, timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling the table; the durations come from applied_at
	}
}

// waitBalanced waits until the live partition leases of consumer are
// spread evenly over members (and over them only), and returns the
// partitions of each.
func (r *replicaRig) waitBalanced(consumer string, members []string) map[string][]int {
	leases := r.pg.Driver.Dialect().(driver.GroupLeases)
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := leases.ListGroups(r.ctx, r.pg.Driver.Pool(), consumer)
		if err != nil {
			r.b.Fatal(err)
		}
		owned := map[string][]int{}
		for _, p := range st.Partitions {
			if p.Live(st.Now) {
				owned[p.Owner] = append(owned[p.Owner], p.Partition)
			}
		}
		ok := len(owned) == len(members)
		for _, m := range members {
			ok = ok && len(owned[m]) == benchPartitions/len(members)
		}
		if ok {
			return owned
		}
		if time.Now().After(deadline) {
			r.b.Fatalf("partition owners %v after 60s, want %d each for %v", owned, benchPartitions/len(members), members)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// replica is a running replica process.
type replica struct {
	member string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *syncBuffer
	schema string // its example database, dropped once it has exited
	exited chan struct{}
}

// syncBuffer is a bytes.Buffer safe for a writing process and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start starts a replica running spec and waits until it is ready (its
// subscriber or group started).
func (r *replicaRig) start(spec replicaSpec) *replica {
	spec.NATSURL, spec.PostgresURL = r.srv.ClientURL(), r.pg.URL
	raw, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^TestReplicaBenchChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), replicaChildEnv+"="+string(raw))
	rep := &replica{member: spec.Member, cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = rep.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		r.b.Fatal(err)
	}
	if rep.stdin, err = cmd.StdinPipe(); err != nil {
		r.b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.b.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		defer close(rep.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				ready <- s
			}
		}
		_ = cmd.Wait()
	}()
	r.b.Cleanup(func() { r.stop(rep) })
	select {
	case rep.schema = <-ready:
	case <-rep.exited:
		r.b.Fatalf("replica %s exited before it was ready:\n%s", spec.Member, rep.stderr.String())
	case <-time.After(60 * time.Second):
		r.b.Fatalf("replica %s not ready after 60s:\n%s", spec.Member, rep.stderr.String())
	}
	return rep
}

// stop stops a replica (SIGTERM: it gives its partitions up), waits for
// it, and drops its example database. It may be called again.
func (r *replicaRig) stop(rep *replica) {
	_ = rep.stdin.Close()
	_ = rep.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-rep.exited:
	case <-time.After(30 * time.Second):
		_ = rep.cmd.Process.Kill()
		<-rep.exited
	}
	r.dropSchema(rep)
}

// kill kills a replica with SIGKILL, waits for its exit, and returns the
// database's clock right before the kill.
func (r *replicaRig) kill(rep *replica) time.Time {
	at := r.now()
	if err := rep.cmd.Process.Kill(); err != nil {
		r.b.Fatal(err)
	}
	<-rep.exited
	r.dropSchema(rep)
	return at
}

func (r *replicaRig) dropSchema(rep *replica) {
	if rep.schema == "" {
		return
	}
	if _, err := r.pg.Pool.Exec(r.ctx, "DROP SCHEMA IF EXISTS "+postgres.QuoteIdent(rep.schema)+" CASCADE"); err != nil {
		r.b.Errorf("drop the example schema of replica %s: %v", rep.member, err)
	}
	rep.schema = ""
}

// open lets the gated replicas consume.
func (r *replicaRig) open(reps []*replica) {
	for _, rep := range reps {
		if _, err := io.WriteString(rep.stdin, "go\n"); err != nil {
			r.b.Fatal(err)
		}
	}
}

// drain publishes n events over aggregates aggregates to a fresh stream,
// starts replicas replicas of a fresh consumer (gated), waits until their
// group has settled (each owns its share of the partitions; or, with
// partitions 0, the one replica is ready), opens the gates and returns
// the events/s from then to the last event applied.
func (r *replicaRig) drain(partitions, replicas, n, aggregates int, spec replicaSpec) float64 {
	stream, pub := r.stream(partitions)
	r.publish(pub, n, aggregates)
	consumer := "c" + uuid.NewString()[:8]
	spec.Stream, spec.Consumer, spec.Gated = stream, consumer, true
	var reps []*replica
	var members []string
	for i := range replicas {
		spec.Member = fmt.Sprintf("m%d", i)
		reps = append(reps, r.start(spec))
		members = append(members, spec.Member)
	}
	if partitions > 0 {
		r.waitBalanced(consumer, members)
	}
	begin := r.now()
	r.open(reps)
	last := r.waitApplied(consumer, n, 10*time.Minute)
	for _, rep := range reps {
		r.stop(rep)
	}
	wall := last.Sub(begin).Seconds()
	// What bounded it: the transactions (batches) and how many ran at
	// once on average (the time spent in batches over the wall time).
	var batches int
	var size, perEvent, inBatches float64
	if err := r.pg.Pool.QueryRow(r.ctx, `WITH t AS (
    SELECT count(*) AS n, extract(epoch FROM max(applied_at) - min(applied_at)) AS span
    FROM bench_effect WHERE consumer = $1 GROUP BY tx)
SELECT count(*), avg(n), coalesce(sum(span) / nullif(sum(n - 1), 0), 0), sum(n) FROM t`, consumer).Scan(&batches, &size, &perEvent, &inBatches); err != nil {
		r.b.Fatal(err)
	}
	// Each batch's span misses its first event: count it in.
	busy := inBatches * perEvent / wall
	r.b.Logf("partitions=%d replicas=%d: %d events in %.2fs (%.0f/s): %d batches of %.1f events on average, %.2f ms per event in a batch, %.1f batches at once on average",
		partitions, replicas, n, wall, float64(n)/wall, batches, size, perEvent*1000, busy)
	return float64(n) / wall
}

// BenchmarkReplicasSlowHandler measures how the consumer's throughput
// grows with its replicas when the handler waits 5 ms per event (standing
// for an I/O-bound downstream): a backlog of 6,000 events over 2,000
// aggregates on a stream of 6 partitions, drained by 1, 2 and 3 replica
// processes (inbox.Group, default timings; batches of up to 100 events,
// each in one transaction). The clock runs from when the group has
// settled (each replica owns its share of the partitions, subscribers
// held back until then) to the last event applied. Reported: events/s per
// replica count and the ratios to one replica; the log line of each drain
// tells the batches, the time per event inside a batch and how many
// batches ran at once on average.
//
// A subscriber handles Workers batches at once, each holding a database
// connection for its whole length (a batch of 100 events at 5 ms is half
// a second), so the consumer runs at most Partitions x Workers batches at
// once, however many replicas share them, and each replica at most its
// pool's size. Sub-benchmarks:
//
//	pool=4/workers=2:  the defaults: pgxpool's pool (4 connections on up to
//	                   4 CPUs), 2 workers per subscriber
//	pool=4/workers=4:  4 workers per subscriber
//	pool=16/workers=2: a pool larger than the 12 batches the consumer can run
//
// Run: go test -run '^$' -bench BenchmarkReplicasSlowHandler -benchtime 1x -count 3 ./inbox/
func BenchmarkReplicasSlowHandler(b *testing.B) {
	for _, v := range []struct {
		pool    int32
		workers int
	}{{4, 2}, {4, 4}, {16, 2}} {
		b.Run(fmt.Sprintf("pool=%d/workers=%d", v.pool, v.workers), func(b *testing.B) {
			r := newReplicaRig(b)
			var rates [3]float64
			for b.Loop() {
				for n := 1; n <= 3; n++ {
					rates[n-1] = r.drain(benchPartitions, n, 6000, 2000,
						replicaSpec{Sleep: 5 * time.Millisecond, MaxConns: v.pool, Workers: v.workers})
				}
			}
			b.ReportMetric(rates[0], "r1_events/s")
			b.ReportMetric(rates[1], "r2_events/s")
			b.ReportMetric(rates[2], "r3_events/s")
			b.ReportMetric(rates[1]/rates[0], "r2/r1")
			b.ReportMetric(rates[2]/rates[0], "r3/r1")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkReplicaKillTakeover measures how long the partitions of a
// replica killed with SIGKILL go unconsumed, with the default timings of
// inbox.Group (Heartbeat 1s, LeaseTTL 5s) and of the NATS subscriber
// (OwnerTTL 5s, StandbyPoll 1s): 3 replica processes share a stream of 6
// partitions; 20 times, one of them is killed (in turn), an event is
// published to each of its partitions right after the kill, and the
// takeover time runs from the kill to the last of those events applied
// (by the database's clock). The killed replica is then replaced by a new
// process, and the next kill waits until the group has settled again and
// an event on every partition has been applied. Reported: p50, max and
// min of the 20 takeovers, in seconds.
//
// Run: go test -run '^$' -bench BenchmarkReplicaKillTakeover -benchtime 1x -count 3 ./inbox/
func BenchmarkReplicaKillTakeover(b *testing.B) {
	const kills = 20
	r := newReplicaRig(b)
	stream, pub := r.stream(benchPartitions)
	// key returns a fresh aggregate id of partition p.
	key := func(round, p int) string {
		for i := 0; ; i++ {
			k := fmt.Sprintf("s%d-%d-%d", round, p, i)
			if stream.Partition([]byte(k)) == p {
				return k
			}
		}
	}
	consumer := "kill"
	spec := replicaSpec{Stream: stream, Consumer: consumer}
	applied := 0
	// sentinels publishes one event to each of partitions and waits
	// until they are applied; it returns when the last was.
	sentinels := func(round int, partitions []int) time.Time {
		var msgs []idem.Message
		for _, p := range partitions {
			ev, err := idem.NewEvent("order.order.placed.v1", "order", key(round, p), map[string]int{"round": round})
			if err != nil {
				b.Fatal(err)
			}
			m, _ := idem.NewMessage(ev)
			msgs = append(msgs, m)
		}
		if err := pub.Publish(r.ctx, msgs); err != nil {
			b.Fatal(err)
		}
		applied += len(msgs)
		return r.waitApplied(consumer, applied, 2*time.Minute)
	}
	all := []int{0, 1, 2, 3, 4, 5}
	var took []time.Duration
	for b.Loop() {
		reps := make([]*replica, 3)
		members := make([]string, 3)
		started := 0
		for i := range reps {
			spec.Member = fmt.Sprintf("r%02d", started)
			started++
			reps[i], members[i] = r.start(spec), spec.Member
		}
		took = took[:0]
		for k := range kills {
			owned := r.waitBalanced(consumer, members)
			sentinels(2*k, all) // every partition is consumed
			victim := k % len(reps)
			killedAt := r.kill(reps[victim])
			last := sentinels(2*k+1, owned[members[victim]])
			took = append(took, last.Sub(killedAt))
			spec.Member = fmt.Sprintf("r%02d", started)
			started++
			reps[victim], members[victim] = r.start(spec), spec.Member
		}
		for _, rep := range reps {
			r.stop(rep)
		}
	}
	slices.Sort(took)
	b.Logf("takeovers after kill -9: %v", took)
	secs := make([]float64, len(took))
	for i, d := range took {
		secs[i] = d.Seconds()
	}
	b.ReportMetric(median(secs), "p50_s")
	b.ReportMetric(took[len(took)-1].Seconds(), "max_s")
	b.ReportMetric(took[0].Seconds(), "min_s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkPartitionCost measures what partitioning costs one replica:
// events/s of one replica process draining a backlog of 20,000 events
// over 1,000 aggregates, handler without sleep (one insert), from an
// unpartitioned stream (one subscriber) and from a stream of 6 partitions
// (an inbox.Group running 6 subscribers), subscriber defaults, a pool of
// 10 connections. The two alternate within the run (unpartitioned,
// partitioned, partitioned, unpartitioned), each over its own stream and
// consumer; the clock runs from the opening of the subscribers (once the
// group owns every partition) to the last event applied.
//
// Run: go test -run '^$' -bench BenchmarkPartitionCost -benchtime 1x -count 3 ./inbox/
func BenchmarkPartitionCost(b *testing.B) {
	const n, aggregates = 20000, 1000
	r := newReplicaRig(b)
	var secs [2]float64 // unpartitioned, partitioned
	for b.Loop() {
		for _, v := range []int{0, 1, 1, 0} {
			rate := r.drain(v*benchPartitions, 1, n, aggregates, replicaSpec{MaxConns: 10})
			secs[v] += n / rate
		}
	}
	plain, parted := float64(2*n*b.N)/secs[0], float64(2*n*b.N)/secs[1]
	b.ReportMetric(plain, "unpartitioned_events/s")
	b.ReportMetric(parted, "group6_events/s")
	b.ReportMetric(parted/plain, "group6/unpartitioned")
	b.ReportMetric(0, "ns/op")
}
