// Package clustertest_test runs broker/amqp's Publisher and Subscriber, with
// an idempotent consumer on PostgreSQL, against a 3-node RabbitMQ 3.10
// cluster of its own (internal/testamqp.Cluster, started once for the
// package, about 30 s) and quorum queues, while nodes are killed, frozen and
// restarted (G12): every confirmed event is applied once, in order per
// aggregate, and the same publisher and subscriber go on without a restart.
//
// Run it with the servers of make test (the shared RabbitMQ node is not
// used, PostgreSQL is):
//
//	IDEM_TEST_SERVERS=postgres bash scripts/test.sh -v -run . ./broker/amqp/clustertest/
//
// IDEM_TEST_AMQP_CLUSTER_KILLS sets how many nodes TestClusterKillNode
// kills one after the other (default 3); it logs the time from each kill
// to publishing and consuming again.
package clustertest_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// shared is the package's cluster, started by the first test that needs it
// and stopped by TestMain.
var shared struct {
	once sync.Once
	c    *testamqp.Cluster
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.c != nil {
		if err := shared.c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "stop the RabbitMQ cluster:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// cluster returns the package's 3-node cluster with every node running.
func cluster(t *testing.T) *testamqp.Cluster {
	t.Helper()
	shared.once.Do(func() {
		t0 := time.Now()
		shared.c, shared.err = testamqp.NewCluster(3)
		if shared.err == nil {
			t.Logf("3-node RabbitMQ cluster started in %v", time.Since(t0).Round(100*time.Millisecond))
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	shared.c.StartAll(t) // after a test that failed with a node down
	return shared.c
}

// rig is a publisher publishing the versions of a few aggregates in order,
// each version only once the previous one is confirmed and republishing a
// version until it is confirmed (as the relay does), and a subscriber
// feeding an idempotent consumer, both on every node of the cluster.
type rig struct {
	t        *testing.T
	c        *testamqp.Cluster
	pg       *testdb.PG
	queue    string
	consumer *inbox.Consumer[pgx.Tx]
	pub      *amqp.Publisher
	sub      *amqp.Subscriber

	stop    chan struct{} // stop publishing once confirmed
	abandon chan struct{} // stop publishing now (the test failed)
	wg      sync.WaitGroup

	mu        sync.Mutex
	confirmed []idem.Message // in confirmation order
	began     map[uuid.UUID]time.Time
	acked     map[uuid.UUID]time.Time
	applied   map[uuid.UUID]time.Time
	failures  int   // Publish calls that failed
	lastErr   error // of the last one
}

const (
	aggregates = 8
	// pace is the delay between two versions of an aggregate: about 160
	// messages a second in all.
	pace = 50 * time.Millisecond
)

func newRig(t *testing.T) *rig {
	t.Helper()
	c := cluster(t)
	exchange := testamqp.Name("idem_c_")
	r := &rig{
		t: t, c: c, pg: testdb.NewPostgres(t), queue: exchange + ".events",
		stop: make(chan struct{}), abandon: make(chan struct{}),
		began: map[uuid.UUID]time.Time{}, acked: map[uuid.UUID]time.Time{}, applied: map[uuid.UUID]time.Time{},
	}
	conn := amqp.ConnConfig{URL: c.URL(), ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, Logger: logger()}
	r.consumer = brokertest.EffectConsumer(t, r.pg.Driver, inbox.Config{Name: "stock"}, nil)
	var err error
	r.sub, err = amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: conn, Exchange: exchange, Queue: r.queue, Bindings: []string{"#"}, QueueType: amqp.Quorum,
	}, r.deliver)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, r.sub) // declares the queue: its leader is on the first node
	r.pub, err = amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: conn, Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.pub.Close() })
	for k := range aggregates {
		r.wg.Add(1)
		go r.publishLoop(strconv.Itoa(k))
	}
	t.Cleanup(func() {
		close(r.abandon)
		r.wg.Wait()
	})
	return r
}

// deliver hands ds to the consumer and records when each was applied.
func (r *rig) deliver(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	disps, errs := r.consumer.DeliverBatch(ctx, ds)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, d := range disps {
		if d.Outcome == broker.Applied && (errs == nil || errs[i] == nil) {
			r.applied[ds[i].Message.EventID] = now
		}
	}
	return disps, errs
}

// publishLoop publishes version 0, 1, 2... of aggregate key until stop; a
// version is published again until confirmed, even after stop.
func (r *rig) publishLoop(key string) {
	defer r.wg.Done()
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for v := 0; ; v++ {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		ev, err := idem.NewEvent("order.order.placed.v1", "order", key, map[string]int{"v": v})
		if err != nil {
			r.t.Error(err)
			return
		}
		msg, err := idem.NewMessage(ev)
		if err != nil {
			r.t.Error(err)
			return
		}
		began := time.Now()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			err := r.pub.Publish(ctx, []idem.Message{msg})
			cancel()
			if err == nil {
				break
			}
			r.mu.Lock()
			r.failures++
			r.lastErr = err
			r.mu.Unlock()
			select { // the next attempt, at the pace of the loop
			case <-tick.C:
			case <-r.abandon:
				return
			}
		}
		r.mu.Lock()
		r.confirmed = append(r.confirmed, msg)
		r.began[msg.EventID] = began
		r.acked[msg.EventID] = time.Now()
		r.mu.Unlock()
	}
}

// stopPublishing stops the publishing loops once their last versions are
// confirmed.
func (r *rig) stopPublishing() {
	r.t.Helper()
	close(r.stop)
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		r.t.Fatal("the publishing loops could not get their last messages confirmed in 3 minutes")
	}
}

// recovered returns when a message whose first publication began at or
// after since was confirmed and when one was applied (zero until then).
func (r *rig) recovered(since time.Time) (confirmed, applied time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Newest first: a message begun after since was confirmed after it.
	for i := len(r.confirmed) - 1; i >= 0; i-- {
		m := r.confirmed[i]
		if r.acked[m.EventID].Before(since.Add(-time.Second)) {
			break
		}
		if r.began[m.EventID].Before(since) {
			continue
		}
		if a := r.acked[m.EventID]; confirmed.IsZero() || a.Before(confirmed) {
			confirmed = a
		}
		if a, ok := r.applied[m.EventID]; ok && (applied.IsZero() || a.Before(applied)) {
			applied = a
		}
	}
	return confirmed, applied
}

// waitResumed waits until a message first published after since has been
// confirmed and applied, and returns how long after since each happened.
func (r *rig) waitResumed(since time.Time, what string) (publish, consume time.Duration) {
	r.t.Helper()
	var c, a time.Time
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if c, a = r.recovered(since); !c.IsZero() && !a.IsZero() {
			return c.Sub(since), a.Sub(since)
		}
		if time.Now().After(deadline) {
			r.dump()
			r.t.Fatalf("timed out after 3m waiting for a message published after %s confirmed (%v) and applied (%v)", what, c, a)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dump logs the state of the clients and the queue, when a wait failed.
func (r *rig) dump() {
	r.mu.Lock()
	r.t.Logf("%d confirmed, %d applied, %d failed Publish calls (the last: %v); consumer %+v; subscriber holds %d",
		len(r.confirmed), len(r.applied), r.failures, r.lastErr, r.consumer.Stats(), r.sub.Held())
	r.mu.Unlock()
	for i := range r.c.Size() {
		if out, err := r.c.CtlErr(i, "-q", "list_queues", "name", "leader", "online", "messages_ready", "messages_unacknowledged", "consumers"); err == nil {
			r.t.Logf("node %d: list_queues:\n%s", i, out)
			out, _ = r.c.CtlErr(i, "-q", "list_consumers")
			r.t.Logf("node %d: list_consumers:\n%s", i, out)
			return
		}
	}
}

// finish stops publishing, waits until every confirmed message is
// applied, and checks that each was applied once, in order per aggregate.
func (r *rig) finish() {
	r.t.Helper()
	r.stopPublishing()
	r.mu.Lock()
	msgs := slices.Clone(r.confirmed)
	failures := r.failures
	r.mu.Unlock()
	testsvc.WaitFor(r.t, 3*time.Minute, fmt.Sprintf("the %d confirmed messages applied", len(msgs)), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, m := range msgs {
			if _, ok := r.applied[m.EventID]; !ok {
				return false
			}
		}
		return true
	})
	brokertest.CheckOnceInOrder(r.t, r.pg, "stock", msgs)
	st := r.consumer.Stats()
	r.t.Logf("%d messages confirmed (%d failed Publish calls, republished), %d applied, %d duplicates skipped, %d parked",
		len(msgs), failures, st.Applied, st.Duplicates, st.Parked)
	if st.Parked != 0 {
		r.t.Errorf("%d messages parked, want 0", st.Parked)
	}
}

// warmUp waits until the loop has published and the consumer applied
// messages.
func (r *rig) warmUp() {
	r.t.Helper()
	start := time.Now()
	r.waitResumed(start, "the start")
}

// leader returns the node of the quorum queue's leader, as a running
// node sees it.
func (r *rig) leader(running int) int {
	r.t.Helper()
	var l int
	testsvc.WaitFor(r.t, time.Minute, "the queue to have a leader", func() bool {
		l = r.c.QueueLeader(r.t, running, r.queue)
		return l >= 0
	})
	return l
}

// awaitQuorum waits until every member of every quorum queue is back.
func (r *rig) awaitQuorum() {
	r.t.Helper()
	testsvc.WaitFor(r.t, 2*time.Minute, "every quorum queue member back (check_if_node_is_quorum_critical)", func() bool {
		return r.c.QuorumSafe(r.t)
	})
}

// TestClusterKillNode kills (kill -9) the node of the queue's leader, the
// node the clients are on at first, waits until publishing and consuming
// resume on the others, restarts it, and does it again; it logs the times
// from each kill to the first confirm and the first application of a
// message published after it.
func TestClusterKillNode(t *testing.T) {
	kills := 3
	if v := os.Getenv("IDEM_TEST_AMQP_CLUSTER_KILLS"); v != "" {
		var err error
		if kills, err = strconv.Atoi(v); err != nil || kills < 1 {
			t.Fatalf("IDEM_TEST_AMQP_CLUSTER_KILLS=%q: want a number, 1 or more", v)
		}
	}
	r := newRig(t)
	r.warmUp()
	var pubs, cons []time.Duration
	for k := range kills {
		victim := r.leader((k + 1) % 3)
		other := (victim + 1) % 3
		killed := time.Now()
		r.c.Kill(t, victim)
		pub, con := r.waitResumed(killed, "the kill")
		pubs, cons = append(pubs, pub), append(cons, con)
		t.Logf("kill %d: node %d (the queue's leader, then node %d): publishing again after %v, consuming again after %v",
			k+1, victim, r.leader(other), pub.Round(time.Millisecond), con.Round(time.Millisecond))
		r.c.Start(t, victim)
		r.waitResumed(time.Now(), "the restart")
		r.awaitQuorum()
	}
	r.finish()
	t.Logf("kill -9 of the leader's node, %d times: publishing again p50 %v max %v; consuming again p50 %v max %v",
		kills, median(pubs), slices.Max(pubs).Round(time.Millisecond), median(cons), slices.Max(cons).Round(time.Millisecond))
}

// freeze is how long TestClusterFreezeNode freezes a node.
const freeze = 30 * time.Second

// TestClusterFreezeNode freezes (SIGSTOP) the node the clients and the
// queue's leader are on for 30 s, then thaws it (SIGCONT).
func TestClusterFreezeNode(t *testing.T) {
	r := newRig(t)
	r.warmUp()
	victim := r.leader(1)
	frozen := time.Now()
	r.c.Freeze(t, victim)
	// The freeze lasts 30 s: the fault's length, not a wait for an outcome.
	thawed := make(chan time.Time, 1)
	timer := time.AfterFunc(freeze, func() {
		thawed <- time.Now()
		r.c.Thaw(t, victim)
	})
	defer func() {
		if timer.Stop() {
			r.c.Thaw(t, victim)
		}
	}()
	pub, con := r.waitResumed(frozen, "the freeze")
	t.Logf("node %d frozen for %v: publishing again after %v, consuming again after %v",
		victim, freeze, pub.Round(time.Millisecond), con.Round(time.Millisecond))
	thaw := <-thawed
	pub, con = r.waitResumed(thaw, "the thaw")
	t.Logf("after the thaw: publishing again after %v, consuming again after %v; the queue's leader is node %d",
		pub.Round(time.Millisecond), con.Round(time.Millisecond), r.leader((victim+1)%3))
	r.awaitQuorum()
	r.finish()
}

// TestClusterRestart stops every node (rabbitmqctl stop) and starts them
// again while the publisher and the subscriber run.
func TestClusterRestart(t *testing.T) {
	r := newRig(t)
	r.warmUp()
	stopping := time.Now()
	r.c.StopAll(t)
	down := time.Now() // every node is down: what is published after comes after the restart
	r.c.StartAll(t)
	t.Logf("cluster stopped in %v, started again in %v", down.Sub(stopping).Round(100*time.Millisecond), time.Since(down).Round(100*time.Millisecond))
	pub, con := r.waitResumed(down, "the cluster's stop")
	t.Logf("from the start of the restart: publishing again after %v, consuming again after %v", pub.Round(time.Millisecond), con.Round(time.Millisecond))
	r.awaitQuorum()
	r.finish()
}

// logger shows the clients' connection events under go test -v.
func logger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return brokertest.Logger()
}

// median returns the median of ds, rounded to the millisecond.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return m.Round(time.Millisecond)
}
