package kafka_test

import (
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem/internal/testload"
)

// The cluster tests run kfake with three brokers, a topic of four
// partitions, and the load of internal/testload: a publisher that
// publishes version after version of testload.Aggregates aggregates (a
// version is published again until every record of it is acknowledged, as
// a relay does) and a subscriber feeding an idempotent consumer on
// PostgreSQL that records each application. While the load runs,
// partition leaders move and brokers stop (their listener and every
// connection closed, as when the process dies) and come back on their
// port. After each fault the test waits until a version published after it
// has been applied (publisher and subscriber resumed, never restarted); at
// the end it checks that every acknowledged version was applied exactly
// once, each aggregate's versions in order.

const (
	kcTopic      = "outbox.event.order"
	kcPartitions = 4
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
	*testload.Load
	c     *kfake.Cluster
	ports []int
}

func newKafkaClusterRig(t *testing.T) *kcRig {
	t.Helper()
	r := &kcRig{Load: testload.New(t)}
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

	// Every broker is a seed: the client still finds the cluster when the
	// one it knows is down.
	pub := newPublisher(t, c)
	subscribe(t, c, testload.Consumer, []string{kcTopic}, r.Deliver)
	r.Start(t, pub)
	return r
}

// TestClusterMoveLeaders moves the leader of every partition to another
// broker, five times, under load.
func TestClusterMoveLeaders(t *testing.T) {
	t.Parallel()
	r := newKafkaClusterRig(t)
	var pubs, conss []time.Duration
	for k := range 5 {
		r.WaitCaughtUp(t)
		t0 := time.Now()
		for p := range int32(kcPartitions) {
			leader := r.c.LeaderFor(kcTopic, p)
			if err := r.c.MoveTopicPartition(kcTopic, p, (leader+1)%3); err != nil {
				t.Fatal(err)
			}
		}
		p, c := r.WaitResumed(t, fmt.Sprintf("leaders moved, #%d", k+1), t0, 60*time.Second)
		pubs, conss = append(pubs, p), append(conss, c)
	}
	t.Logf("measure: kafka (kfake) leaders moved: publishing again p50 %v max %v; consuming again p50 %v max %v",
		testload.Median(pubs), slices.Max(pubs), testload.Median(conss), slices.Max(conss))
	r.Finish(t)
}

// TestClusterStopBroker stops the broker leading partition 0 (its listener
// and connections closed, its partitions led by the others), five times,
// and starts it again on its port after publishing and consuming resumed.
func TestClusterStopBroker(t *testing.T) {
	t.Parallel()
	r := newKafkaClusterRig(t)
	var pubs, conss []time.Duration
	for k := range 5 {
		r.WaitCaughtUp(t)
		node := r.c.LeaderFor(kcTopic, 0)
		t0 := time.Now()
		if err := r.c.RemoveNode(node); err != nil {
			t.Fatal(err)
		}
		p, c := r.WaitResumed(t, fmt.Sprintf("broker %d stopped, #%d", node, k+1), t0, 60*time.Second)
		pubs, conss = append(pubs, p), append(conss, c)
		t1 := time.Now()
		if _, _, err := r.c.AddNode(node, r.ports[node]); err != nil {
			t.Fatal(err)
		}
		r.WaitResumed(t, fmt.Sprintf("broker %d started again", node), t1, 60*time.Second)
	}
	t.Logf("measure: kafka (kfake) broker leading a partition stopped: publishing again p50 %v max %v; consuming again p50 %v max %v",
		testload.Median(pubs), slices.Max(pubs), testload.Median(conss), slices.Max(conss))
	r.Finish(t)
}
