package registry

import (
	"context"
	"net/url"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/internal/testnatscluster"
)

// TestNATSClusterURL checks that a URL listing several servers reaches the
// client whole, and that replicas sets the stream's replicas.
func TestNATSClusterURL(t *testing.T) {
	for raw, want := range map[string]string{
		"nats://a:4222,b:4222,c:4222?stream=S&replicas=3":                        "nats://a:4222,b:4222,c:4222",
		"nats://a:4222,nats://b:4222,nats://c:4222?replicas=3&ack_wait=5s":       "nats://a:4222,nats://b:4222,nats://c:4222",
		"tls://a:4222,b:4222?replicas=3&stream=S&ca=ca.pem&cert=c.pem&key=k.pem": "tls://a:4222,b:4222",
	} {
		u, err := parseURL(natsURL(raw))
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		cc, release, err := natsConn(context.Background(), u, "test", nil)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		_ = release()
		if cc.URL != want {
			t.Errorf("%s: connection URL %q, want %q", raw, cc.URL, want)
		}
		s, err := natsStream(u, "")
		if err != nil || s.Replicas != 3 {
			t.Errorf("%s: stream %+v, %v: want 3 replicas", raw, s, err)
		}
	}
	for _, raw := range []string{"nats://a:4222?replicas=0", "nats://a:4222?replicas=three"} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := natsStream(u, ""); err == nil {
			t.Errorf("%s: no error", raw)
		}
	}
}

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
