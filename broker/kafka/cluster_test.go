package kafka_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// The cluster tests run kfake with three brokers, a topic of four
// partitions, a publisher that publishes version after version of
// kcAggregates aggregates (a version is published again until every record
// of it is acknowledged, as a relay does) and a subscriber feeding an
// idempotent consumer on PostgreSQL that records each application. While
// the load runs, partition leaders move and brokers stop (their listener
// and every connection closed, as when the process dies) and come back on
// their port. After each fault the test waits until a version published
// after it has been applied (publisher and subscriber resumed, never
// restarted); at the end it checks that every acknowledged version was
// applied exactly once, each aggregate's versions in order.

const (
	kcTopic      = "outbox.event.order"
	kcAggregates = 8
	kcPartitions = 4
	kcPace       = 10 * time.Millisecond
)

// kcListener is a broker's listener that closes the connections it
// accepted when it is closed: kfake's RemoveNode closes the listener only,
// and a broker that dies takes its connections with it.
type kcListener struct {
	net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func (l *kcListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	l.conns = append(l.conns, c)
	return c, nil
}

func (l *kcListener) Close() error {
	l.mu.Lock()
	l.closed = true
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return l.Listener.Close()
}

// kcRig is a three-broker kfake cluster under load.
type kcRig struct {
	c     *kfake.Cluster
	ports []int
	pg    *testdb.PG
	cons  *inbox.Consumer[pgx.Tx]

	mu sync.Mutex
	// okStart[v-1] is when the attempt that published version v began,
	// okEnd[v-1] when it was acknowledged.
	okStart, okEnd []time.Time
	// appliedAt[v] is when an event of version v was first seen applied.
	appliedAt map[int64]time.Time
	failures  int
	lastErr   error

	stopLoad chan struct{}
	loadDone chan struct{}
}

func newKafkaClusterRig(t *testing.T) *kcRig {
	t.Helper()
	r := &kcRig{
		pg:        testdb.NewPostgres(t),
		appliedAt: map[int64]time.Time{},
		stopLoad:  make(chan struct{}),
		loadDone:  make(chan struct{}),
	}
	r.ports = []int{freePort(t), freePort(t), freePort(t)}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(3),
		kfake.Ports(r.ports...),
		kfake.SeedTopics(kcPartitions, kcTopic),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			l, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			return &kcListener{Listener: l}, nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	r.c = c

	r.pg.Exec(t, `CREATE TABLE applied (seq bigserial PRIMARY KEY, aggregate_id text NOT NULL, version bigint NOT NULL)`)
	cons, err := inbox.New[pgx.Tx](r.pg.Driver, inbox.Config{Name: "stock", Logger: brokertest.Logger(),
		Retry: inbox.RetryPolicy{InitialDelay: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Jitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	cons.Handle("order.order.changed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (aggregate_id, version) VALUES ($1, $2)`, ev.AggregateID, ev.AggregateVersion)
		return err
	})
	r.cons = cons

	// Every broker is a seed: the client still finds the cluster when the
	// one it knows is down.
	pub := newPublisher(t, c)
	subscribe(t, c, "stock", []string{kcTopic}, r.deliver)
	go r.load(pub)
	t.Cleanup(r.stop)
	r.waitResumed(t, "start", time.Now(), 60*time.Second)
	return r
}

func (r *kcRig) deliver(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	disps, errs := r.cons.DeliverBatch(ctx, ds)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, d := range ds {
		if i >= len(disps) || disps[i].Outcome != inbox.Applied {
			continue
		}
		if ev, err := idem.Decode(d.Message); err == nil {
			if _, ok := r.appliedAt[ev.AggregateVersion]; !ok {
				r.appliedAt[ev.AggregateVersion] = now
			}
		}
	}
	return disps, errs
}

func (r *kcRig) load(pub *kafka.Publisher) {
	defer close(r.loadDone)
	for v := int64(1); ; v++ {
		msgs := make([]idem.Message, kcAggregates)
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
			r.mu.Lock()
			if err == nil {
				r.okStart = append(r.okStart, start)
				r.okEnd = append(r.okEnd, time.Now())
			} else {
				r.failures++
				r.lastErr = err
			}
			r.mu.Unlock()
			if err == nil {
				break
			}
			select {
			case <-r.stopLoad:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		select {
		case <-r.stopLoad:
			return
		case <-time.After(kcPace):
		}
	}
}

func (r *kcRig) stop() {
	select {
	case <-r.stopLoad:
	default:
		close(r.stopLoad)
	}
	<-r.loadDone
}

// resumed returns, once a version whose publication began after t0 has
// been applied, how long after t0 it was acknowledged and applied.
func (r *kcRig) resumed(t0 time.Time) (pub, cons time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, _ := slices.BinarySearchFunc(r.okStart, t0, func(s, t time.Time) int { return s.Compare(t) })
	if i == len(r.okStart) {
		return 0, 0, false
	}
	pub = r.okEnd[i].Sub(t0)
	for v := i; v < len(r.okStart); v++ {
		if at, ok := r.appliedAt[int64(v+1)]; ok {
			return pub, at.Sub(t0), true
		}
	}
	return 0, 0, false
}

func (r *kcRig) waitResumed(t *testing.T, what string, t0 time.Time, timeout time.Duration) (pub, cons time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if p, c, ok := r.resumed(t0); ok {
			if what != kcCaughtUp {
				t.Logf("measure: %s: publishing again after %v, consuming after %v", what, p.Round(time.Millisecond), c.Round(time.Millisecond))
			}
			return p, c
		}
		if time.Now().After(deadline) {
			r.mu.Lock()
			n, f, last := len(r.okStart), r.failures, r.lastErr
			r.mu.Unlock()
			t.Fatalf("%s: no version published after the fault and applied within %v (%d versions published, %d failed attempts, last error %v, %d applied)",
				what, timeout, n, f, last, r.cons.Stats().Applied)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kcCaughtUp is what waitCaughtUp waits for, not logged as a measure.
const kcCaughtUp = "caught up"

// waitCaughtUp waits until the consumer has applied a version published
// after every version acknowledged so far: measurements then start from no
// backlog.
func (r *kcRig) waitCaughtUp(t *testing.T) {
	t.Helper()
	r.waitResumed(t, kcCaughtUp, time.Now(), 120*time.Second)
}

// finish stops the load, waits until every acknowledged version has been
// applied and checks that each was applied once, in order per aggregate.
func (r *kcRig) finish(t *testing.T) {
	t.Helper()
	r.stop()
	r.mu.Lock()
	versions, failures := len(r.okStart), r.failures
	r.mu.Unlock()
	want := versions * kcAggregates
	testsvc.WaitFor(t, 60*time.Second, fmt.Sprintf("the %d events of %d versions applied", want, versions), func() bool {
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
				t.Errorf("aggregate %s: version %d applied after version %d", agg, v, last[agg])
			}
		}
		last[agg] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	extra := 0
	for a := range kcAggregates {
		got := last[fmt.Sprintf("a%d", a)]
		if got < int64(versions) {
			t.Errorf("aggregate a%d: last version applied %d, want %d", a, got, versions)
		}
		// Records of the version the stop interrupted, acknowledged
		// before the attempt failed on another record.
		extra += max(0, int(got)-versions)
	}
	if n != want+extra {
		t.Errorf("%d applications, want %d (+%d of the interrupted version)", n, want, extra)
	}
	if disorder > 10 {
		t.Errorf("... %d applications out of order in all", disorder)
	}
	s := r.cons.Stats()
	t.Logf("checked %d versions x %d aggregates (%d applications out of order); %d failed publish attempts; consumer: %d applied, %d duplicates skipped",
		versions, kcAggregates, disorder, failures, s.Applied, s.Duplicates)
}

// TestClusterMoveLeaders moves the leader of every partition to another
// broker, five times, under load.
func TestClusterMoveLeaders(t *testing.T) {
	t.Parallel()
	r := newKafkaClusterRig(t)
	var pubs, conss []time.Duration
	for k := range 5 {
		r.waitCaughtUp(t)
		t0 := time.Now()
		for p := range int32(kcPartitions) {
			leader := r.c.LeaderFor(kcTopic, p)
			if err := r.c.MoveTopicPartition(kcTopic, p, (leader+1)%3); err != nil {
				t.Fatal(err)
			}
		}
		p, c := r.waitResumed(t, fmt.Sprintf("leaders moved, #%d", k+1), t0, 60*time.Second)
		pubs, conss = append(pubs, p), append(conss, c)
	}
	t.Logf("measure: kafka (kfake) leaders moved: publishing again p50 %v max %v; consuming again p50 %v max %v",
		kcMedian(pubs), slices.Max(pubs), kcMedian(conss), slices.Max(conss))
	r.finish(t)
}

// TestClusterStopBroker stops the broker leading partition 0 (its listener
// and connections closed, its partitions led by the others), five times,
// and starts it again on its port after publishing and consuming resumed.
func TestClusterStopBroker(t *testing.T) {
	t.Parallel()
	r := newKafkaClusterRig(t)
	var pubs, conss []time.Duration
	for k := range 5 {
		r.waitCaughtUp(t)
		node := r.c.LeaderFor(kcTopic, 0)
		t0 := time.Now()
		if err := r.c.RemoveNode(node); err != nil {
			t.Fatal(err)
		}
		p, c := r.waitResumed(t, fmt.Sprintf("broker %d stopped, #%d", node, k+1), t0, 60*time.Second)
		pubs, conss = append(pubs, p), append(conss, c)
		t1 := time.Now()
		if _, _, err := r.c.AddNode(node, r.ports[node]); err != nil {
			t.Fatal(err)
		}
		r.waitResumed(t, fmt.Sprintf("broker %d started again", node), t1, 60*time.Second)
	}
	t.Logf("measure: kafka (kfake) broker leading a partition stopped: publishing again p50 %v max %v; consuming again p50 %v max %v",
		kcMedian(pubs), slices.Max(pubs), kcMedian(conss), slices.Max(conss))
	r.finish(t)
}

func kcMedian(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
