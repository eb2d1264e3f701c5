package registry

import (
	"context"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/internal/testnatscluster"
)

// TestNATSCluster publishes through Open with the URL of a three-server
// cluster: the stream is created with three replicas.
func TestNATSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server cluster; not with -short")
	}
	c := testnatscluster.Start(t, testnatscluster.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pub, err := Open(ctx, c.URL()+"?stream=CL&prefix=cl&replicas=3")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	nc, err := natsgo.Connect(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "CL")
	if err != nil {
		t.Fatal(err)
	}
	if info := s.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Errorf("stream CL: %d replicas configured, cluster %+v; want 3 (a leader and two followers)", info.Config.Replicas, info.Cluster)
	}
}
