package nats_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testnatscluster"
	"github.com/idem-go/idem/internal/testsvc"
)

// The cluster tests run a three-server JetStream cluster of real nats-server
// processes (internal/testnatscluster), a stream with three replicas, a
// publisher that publishes version after version of clAggregates aggregates
// (a version is published again until JetStream acknowledges all of it,
// as a relay does), and a subscriber feeding an idempotent consumer on
// PostgreSQL that records each application. While the load runs, servers
// are killed, frozen, or the whole cluster restarted; after each fault the
// test waits until a version published after it has been applied (the
// publisher and the subscriber resumed, never restarted), and at the end
// checks that every acknowledged version was applied exactly once, each
// aggregate's versions in order.

const (
	clAggregates = 8
	// clPace is the pause between two versions: about 8 x 100 events/s,
	// leaving the two cores of the test machine to the servers.
	clPace = 10 * time.Millisecond
)

// clConnOptions make a client notice a frozen server within about two
// seconds (PING every 500ms, two outstanding) instead of nats.go's
// default of four minutes, and move to another server of the cluster.
func clConnOptions() []natsgo.Option {
	return []natsgo.Option{natsgo.PingInterval(500 * time.Millisecond), natsgo.MaxPingsOutstanding(2)}
}

// clRig is a cluster under load.
type clRig struct {
	c      *testnatscluster.Cluster
	stream nats.StreamConfig
	pg     *testdb.PG
	cons   *inbox.Consumer[pgx.Tx]

	mu sync.Mutex
	// okStart[v-1] is when the attempt that published version v began,
	// okEnd[v-1] when it was acknowledged.
	okStart, okEnd []time.Time
	// appliedAt[v] is when an event of version v was first seen applied
	// (after its transaction committed).
	appliedAt map[int64]time.Time
	// attempt[aggregate/version] is the delivery attempt (JetStream's
	// delivery count) that applied it: a late application that was a
	// redelivery points at a lost delivery.
	attempt  map[string]int
	failures int // failed publish attempts

	stopLoad chan struct{}
	loadDone chan struct{}
	pubErr   atomic.Value // last publish error, for the logs
}

// newClusterRig starts the cluster, the publisher's load and the subscriber.
func newClusterRig(t *testing.T, cfg testnatscluster.Config) *clRig {
	t.Helper()
	if testing.Short() {
		t.Skip("the cluster tests run a nats-server cluster for minutes; not with -short")
	}
	r := &clRig{
		c:         testnatscluster.Start(t, cfg),
		stream:    newNames().stream,
		pg:        testdb.NewPostgres(t),
		appliedAt: map[int64]time.Time{},
		attempt:   map[string]int{},
		stopLoad:  make(chan struct{}),
		loadDone:  make(chan struct{}),
	}
	r.stream.Replicas = 3
	r.pg.Exec(t, `CREATE TABLE applied (seq bigserial PRIMARY KEY, aggregate_id text NOT NULL, version bigint NOT NULL)`)
	cons, err := inbox.New[pgx.Tx](r.pg.Driver, inbox.Config{Name: "stock", Retry: fastRetry, Logger: brokertest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	cons.Handle("order.order.changed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (aggregate_id, version) VALUES ($1, $2)`, ev.AggregateID, ev.AggregateVersion)
		return err
	})
	r.cons = cons

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pub, err := nats.NewPublisher(ctx, nats.PublisherConfig{
		ConnConfig: nats.ConnConfig{URL: r.c.URL(), Name: "cluster-test-publisher", ReconnectWait: 50 * time.Millisecond,
			Options: clConnOptions(), Logger: brokertest.Logger().With("client", "publisher")},
		Stream: r.stream,
		// A message whose server died is published again after 5s.
		AckTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	sub, err := nats.NewSubscriber(nats.SubscriberConfig{
		ConnConfig: nats.ConnConfig{URL: r.c.URL(), Name: "cluster-test-subscriber", ReconnectWait: 50 * time.Millisecond,
			Options: clConnOptions(), Logger: brokertest.Logger().With("client", "subscriber")},
		Stream:   r.stream,
		Consumer: "stock",
		Bindings: []string{"order.>"},
	}, r.deliver)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)

	go r.load(pub)
	t.Cleanup(r.stop)
	r.waitResumed(t, "start", time.Now(), 60*time.Second)
	return r
}

// deliver hands a batch to the consumer and notes when each version was
// first applied.
func (r *clRig) deliver(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	disps, errs := r.cons.DeliverBatch(ctx, ds)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, d := range ds {
		if i >= len(disps) || disps[i].Outcome != inbox.Applied {
			continue
		}
		ev, err := idem.Decode(d.Message)
		if err != nil {
			continue
		}
		if _, ok := r.appliedAt[ev.AggregateVersion]; !ok {
			r.appliedAt[ev.AggregateVersion] = now
		}
		r.attempt[fmt.Sprintf("%s/%d", ev.AggregateID, ev.AggregateVersion)] = d.Attempt
	}
	return disps, errs
}

// load publishes version 1, 2, ... of every aggregate, one version per
// call, publishing a version again until all of it is acknowledged, until
// stop.
func (r *clRig) load(pub *nats.Publisher) {
	defer close(r.loadDone)
	for v := int64(1); ; v++ {
		msgs := make([]idem.Message, clAggregates)
		for a := range msgs {
			ev, err := idem.NewEvent("order.order.changed.v1", "order", fmt.Sprintf("a%d", a), map[string]int64{"version": v})
			if err != nil {
				panic(err)
			}
			ev.AggregateVersion = v
			if msgs[a], err = idem.NewMessage(ev); err != nil {
				panic(err)
			}
		}
		for {
			select {
			case <-r.stopLoad:
				return
			default:
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := pub.Publish(ctx, msgs)
			cancel()
			if err == nil {
				r.mu.Lock()
				r.okStart = append(r.okStart, start)
				r.okEnd = append(r.okEnd, time.Now())
				r.mu.Unlock()
				break
			}
			r.pubErr.Store(err.Error())
			r.mu.Lock()
			r.failures++
			r.mu.Unlock()
			select {
			case <-r.stopLoad:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		select {
		case <-r.stopLoad:
			return
		case <-time.After(clPace):
		}
	}
}

func (r *clRig) stop() {
	select {
	case <-r.stopLoad:
	default:
		close(r.stopLoad)
	}
	<-r.loadDone
}

// resumed returns, once a version whose publication began after t0 has
// been applied, how long after t0 its publication was acknowledged and it
// was applied.
func (r *clRig) resumed(t0 time.Time) (pub, cons time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, _ := slices.BinarySearchFunc(r.okStart, t0, func(s, t time.Time) int { return s.Compare(t) })
	if i == len(r.okStart) {
		return 0, 0, false
	}
	pub = r.okEnd[i].Sub(t0)
	// The first version published after t0 that was applied (one may have
	// been applied before a later one only if it had been published
	// earlier, which it was not, so the first applied is i's or later).
	for v := i; v < len(r.okStart); v++ {
		if at, ok := r.appliedAt[int64(v+1)]; ok {
			return pub, at.Sub(t0), true
		}
	}
	return 0, 0, false
}

// waitResumed waits until a version published after t0 has been applied,
// and logs how long publishing and consuming took to resume.
func (r *clRig) waitResumed(t *testing.T, what string, t0 time.Time, timeout time.Duration) (pub, cons time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if p, c, ok := r.resumed(t0); ok {
			if what != caughtUp {
				t.Logf("measure: %s: publishing again after %v, consuming after %v", what, p.Round(time.Millisecond), c.Round(time.Millisecond))
			}
			return p, c
		}
		if time.Now().After(deadline) {
			r.mu.Lock()
			n, f := len(r.okStart), r.failures
			r.mu.Unlock()
			t.Fatalf("%s: no version published after the fault and applied within %v (%d versions published, %d failed attempts, last error %v, %d applied)",
				what, timeout, n, f, r.pubErr.Load(), r.cons.Stats().Applied)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitVersions waits until n versions have been published, so that a fault
// hits a stream with history and a load in full swing.
func (r *clRig) waitVersions(t *testing.T, n int) {
	t.Helper()
	testsvc.WaitFor(t, 120*time.Second, fmt.Sprintf("%d versions published", n), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.okStart) >= n
	})
}

// caughtUp is what waitCaughtUp waits for, not logged as a measure.
const caughtUp = "caught up"

// waitCaughtUp waits until the consumer has applied a version published
// after every version acknowledged so far: measurements then start from no
// backlog.
func (r *clRig) waitCaughtUp(t *testing.T) {
	t.Helper()
	r.waitResumed(t, caughtUp, time.Now(), 120*time.Second)
}

// finish stops the load, waits until every acknowledged version has been
// applied and checks that each was applied once, in order per aggregate.
func (r *clRig) finish(t *testing.T) {
	t.Helper()
	r.stop()
	r.mu.Lock()
	versions, failures := len(r.okStart), r.failures
	r.mu.Unlock()
	want := versions * clAggregates
	testsvc.WaitFor(t, 90*time.Second, fmt.Sprintf("the %d events of %d versions applied", want, versions), func() bool {
		return r.pg.Count(t, "(SELECT DISTINCT aggregate_id, version FROM applied WHERE version <= $1) d", versions) == want
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := r.pg.Pool.Query(ctx, `SELECT aggregate_id, version FROM applied ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	n, disorder := 0, 0
	for rows.Next() {
		var agg string
		var v int64
		if err := rows.Scan(&agg, &v); err != nil {
			t.Fatal(err)
		}
		n++
		if v != last[agg]+1 {
			// Out of order (or twice): report the first few only.
			if disorder++; disorder <= 10 {
				r.mu.Lock()
				attempt := r.attempt[fmt.Sprintf("%s/%d", agg, v)]
				r.mu.Unlock()
				t.Errorf("aggregate %s: version %d applied after version %d (at its delivery attempt %d)", agg, v, last[agg], attempt)
			}
		}
		last[agg] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	for a := range clAggregates {
		if got := last[fmt.Sprintf("a%d", a)]; got < int64(versions) {
			t.Errorf("aggregate a%d: last version applied %d, want %d", a, got, versions)
		}
	}
	if n != want {
		// Versions above the last acknowledged one come from an attempt
		// that failed on one message after JetStream stored the others;
		// they are published again (and deduplicated) by the next attempt,
		// which the stop interrupted. Anything else is a double.
		extra := 0
		for _, v := range last {
			extra += int(v) - versions
		}
		if n != want+extra {
			t.Errorf("%d applications, want %d (+%d of the interrupted version)", n, want, extra)
		}
	}
	if disorder > 10 {
		t.Errorf("... %d applications out of order in all", disorder)
	}
	s := r.cons.Stats()
	t.Logf("checked %d versions x %d aggregates (%d applications out of order); %d failed publish attempts; consumer: %d applied, %d duplicates skipped",
		versions, clAggregates, disorder, failures, s.Applied, s.Duplicates)
}

// TestClusterKillServer kills, with kill -9, the stream's leader and the
// durable consumer's leader in turn, six times, restarting the server
// after publishing and consuming resumed each time.
func TestClusterKillServer(t *testing.T) {
	r := newClusterRig(t, testnatscluster.Config{})
	var pubs, conss []time.Duration
	for k := range 6 {
		r.waitCaughtUp(t)
		victim, role := r.c.StreamLeader(t, r.stream.Name), "stream leader"
		if k%2 == 1 {
			victim, role = r.c.ConsumerLeader(t, r.stream.Name, "stock"), "consumer leader"
		}
		t0 := time.Now()
		r.c.Kill(victim)
		p, c := r.waitResumed(t, fmt.Sprintf("kill -9 of %s (%s), #%d", r.c.Name(victim), role, k+1), t0, 90*time.Second)
		pubs, conss = append(pubs, p), append(conss, c)
		t1 := time.Now()
		r.c.Restart(victim)
		r.waitResumed(t, "restart of "+r.c.Name(victim), t1, 90*time.Second)
	}
	t.Logf("measure: nats kill -9 of a leader: publishing again p50 %v max %v; consuming again p50 %v max %v",
		median(pubs), slices.Max(pubs), median(conss), slices.Max(conss))
	r.finish(t)
}

// TestClusterFreezeServer freezes the stream's leader (SIGSTOP) for 30s
// and thaws it (SIGCONT).
func TestClusterFreezeServer(t *testing.T) {
	r := newClusterRig(t, testnatscluster.Config{})
	r.waitCaughtUp(t)
	leader := r.c.StreamLeader(t, r.stream.Name)
	t0 := time.Now()
	r.c.Freeze(leader)
	r.waitResumed(t, "SIGSTOP of "+r.c.Name(leader)+" (stream leader)", t0, 90*time.Second)
	if got := r.c.StreamLeader(t, r.stream.Name); got == leader {
		t.Fatalf("%s still leads while frozen", r.c.Name(leader))
	}
	// The fault lasts 30s, whatever the test has seen meanwhile (this
	// wait proves nothing; the sentinels above and below do).
	<-time.After(time.Until(t0.Add(30 * time.Second)))
	t1 := time.Now()
	r.c.Thaw(leader)
	r.c.WaitHealthy(t)
	r.waitResumed(t, "SIGCONT of "+r.c.Name(leader), t1, 90*time.Second)
	r.finish(t)
}

// TestClusterRestartAll stops every server of the cluster (SIGTERM) and
// starts them again.
func TestClusterRestartAll(t *testing.T) {
	r := newClusterRig(t, testnatscluster.Config{})
	r.waitVersions(t, 300)
	t0 := time.Now()
	r.c.StopAll()
	r.c.StartAll()
	r.waitResumed(t, "restart of the whole cluster", t0, 120*time.Second)
	r.finish(t)
}

// TestClusterKillAll kills every server at once (kill -9) and starts them
// again: with sync_interval always, nothing JetStream acknowledged is lost.
func TestClusterKillAll(t *testing.T) {
	r := newClusterRig(t, testnatscluster.Config{SyncAlways: true})
	r.waitVersions(t, 300)
	t0 := time.Now()
	r.c.KillAll()
	r.c.StartAll()
	r.waitResumed(t, "kill -9 of the whole cluster", t0, 120*time.Second)
	r.finish(t)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
