package nats_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/internal/testload"
	"github.com/idem-go/idem/internal/testnatscluster"
	"github.com/idem-go/idem/internal/testsvc"
)

// The cluster tests run a three-server JetStream cluster of real nats-server
// processes (internal/testnatscluster), a stream with three replicas, and
// the load of internal/testload: a publisher that publishes version after
// version of testload.Aggregates aggregates (a version is published again
// until JetStream acknowledges all of it, as a relay does), and a
// subscriber feeding an idempotent consumer on PostgreSQL that records
// each application. While the load runs, servers
// are killed, frozen, or the whole cluster restarted; after each fault the
// test waits until a version published after it has been applied (the
// publisher and the subscriber resumed, never restarted), and at the end
// checks that every acknowledged version was applied exactly once, each
// aggregate's versions in order.

// clConnOptions make a client notice a frozen server within about two
// seconds (PING every 500ms, two outstanding) instead of nats.go's
// default of four minutes, and move to another server of the cluster.
func clConnOptions() []natsgo.Option {
	return []natsgo.Option{natsgo.PingInterval(500 * time.Millisecond), natsgo.MaxPingsOutstanding(2)}
}

// clRig is a cluster under load.
type clRig struct {
	*testload.Load
	c      *testnatscluster.Cluster
	stream nats.StreamConfig
}

// newClusterRig starts the cluster, the publisher's load and the subscriber.
func newClusterRig(t *testing.T, cfg testnatscluster.Config) *clRig {
	t.Helper()
	if testing.Short() {
		t.Skip("the cluster tests run a nats-server cluster for minutes; not with -short")
	}
	r := &clRig{
		c:      testnatscluster.Start(t, cfg),
		stream: newNames().stream,
		Load:   testload.New(t),
	}
	r.stream.Replicas = 3

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
		Consumer: testload.Consumer,
		Bindings: []string{"order.>"},
	}, r.Deliver)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)

	r.Start(t, pub)
	return r
}

// TestClusterKillServer kills, with kill -9, the stream's leader and the
// durable consumer's leader in turn, six times, restarting the server
// after publishing and consuming resumed each time.
func TestClusterKillServer(t *testing.T) {
	r := newClusterRig(t, testnatscluster.Config{})
	var pubs, conss []time.Duration
	for k := range 6 {
		r.WaitCaughtUp(t)
		victim, role := r.c.StreamLeader(t, r.stream.Name), "stream leader"
		if k%2 == 1 {
			victim, role = r.c.ConsumerLeader(t, r.stream.Name, testload.Consumer), "consumer leader"
		}
		t0 := time.Now()
		r.c.Kill(victim)
		p, c := r.WaitResumed(t, fmt.Sprintf("kill -9 of %s (%s), #%d", r.c.Name(victim), role, k+1), t0, 90*time.Second)
		pubs, conss = append(pubs, p), append(conss, c)
		t1 := time.Now()
		r.c.Restart(victim)
		r.WaitResumed(t, "restart of "+r.c.Name(victim), t1, 90*time.Second)
	}
	t.Logf("measure: nats kill -9 of a leader: publishing again p50 %v max %v; consuming again p50 %v max %v",
		testload.Median(pubs), slices.Max(pubs), testload.Median(conss), slices.Max(conss))
	r.Finish(t)
}

// TestClusterFreezeServer freezes the stream's leader (SIGSTOP) for 30s
// and thaws it (SIGCONT).
func TestClusterFreezeServer(t *testing.T) {
	r := newClusterRig(t, testnatscluster.Config{})
	r.WaitCaughtUp(t)
	leader := r.c.StreamLeader(t, r.stream.Name)
	t0 := time.Now()
	r.c.Freeze(leader)
	r.WaitResumed(t, "SIGSTOP of "+r.c.Name(leader)+" (stream leader)", t0, 90*time.Second)
	if got := r.c.StreamLeader(t, r.stream.Name); got == leader {
		t.Fatalf("%s still leads while frozen", r.c.Name(leader))
	}
	// The fault lasts 30s, whatever the test has seen meanwhile (this
	// wait proves nothing; the sentinels above and below do).
	<-time.After(time.Until(t0.Add(30 * time.Second)))
	t1 := time.Now()
	r.c.Thaw(leader)
	r.c.WaitHealthy(t)
	r.WaitResumed(t, "SIGCONT of "+r.c.Name(leader), t1, 90*time.Second)
	r.Finish(t)
}

// TestClusterRestartAll stops every server of the cluster (SIGTERM) and
// starts them again.
func TestClusterRestartAll(t *testing.T) {
	r := newClusterRig(t, testnatscluster.Config{})
	r.WaitVersions(t, 300)
	t0 := time.Now()
	r.c.StopAll()
	r.c.StartAll()
	r.WaitResumed(t, "restart of the whole cluster", t0, 120*time.Second)
	r.Finish(t)
}

// TestClusterKillAll kills every server at once (kill -9) and starts them
// again: with sync_interval always, nothing JetStream acknowledged is lost.
func TestClusterKillAll(t *testing.T) {
	r := newClusterRig(t, testnatscluster.Config{SyncAlways: true})
	r.WaitVersions(t, 300)
	t0 := time.Now()
	r.c.KillAll()
	r.c.StartAll()
	r.WaitResumed(t, "kill -9 of the whole cluster", t0, 120*time.Second)
	r.Finish(t)
}
