package kafka_test

import (
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
)

// restartable is a kfake cluster that keeps its data in a directory and can
// be restarted on the same port.
type restartable struct {
	mu   sync.Mutex
	dir  string
	port int
	c    *kfake.Cluster
}

func (r *restartable) start(t testing.TB, topics ...string) {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(r.port), kfake.DataDir(r.dir), kfake.SyncWrites()}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(3, topics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	r.mu.Lock()
	r.c = c
	r.mu.Unlock()
}

func (r *restartable) cluster() *kfake.Cluster {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.c
}

func TestConformance(t *testing.T) {
	// The suite's restart test restarts the cluster of the last instance
	// made, and runs alone.
	var (
		mu   sync.Mutex
		last *restartable
	)
	brokertest.Run(t, brokertest.Transport{
		New: func(t *testing.T, o brokertest.Options) brokertest.Instance {
			r := &restartable{dir: t.TempDir(), port: freePort(t)}
			r.start(t, "outbox.event.test")
			t.Cleanup(func() { r.cluster().Close() })
			mu.Lock()
			last = r
			mu.Unlock()
			group := "conformance"
			return brokertest.Instance{
				Publisher: newPublisher(t, r.cluster()),
				Subscribe: func(t *testing.T, deliver broker.DeliverFunc) func() {
					_, stop := subscribe(t, r.cluster(), group, []string{"outbox.event.test"}, broker.DeliverFunc(deliver))
					return stop
				},
			}
		},
		Features: brokertest.Features{
			Restart: func(t *testing.T) {
				mu.Lock()
				r := last
				mu.Unlock()
				r.cluster().Close()
				r.start(t)
			},
			Timeout: 30 * time.Second,
		},
	})
}
