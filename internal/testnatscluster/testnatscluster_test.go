package testnatscluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/testnatscluster"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCluster starts a cluster, creates a stream with three replicas, kills
// its leader and checks that a new one serves the stored messages.
func TestCluster(t *testing.T) {
	c := testnatscluster.Start(t, testnatscluster.Config{})
	nc, err := nats.Connect(c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// The stream answers once its replicas elected a leader, which may
	// come after CreateStream returns, and again after a kill.
	publish := func(subject, data string) {
		t.Helper()
		for {
			actx, acancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := js.Publish(actx, subject, []byte(data), jetstream.WithMsgID(subject)) // stored once, however many tries
			acancel()
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	publish("s.1", "one")
	leader := c.StreamLeader(t, "S")
	c.Kill(leader)
	if got := c.StreamLeader(t, "S"); got == leader {
		t.Fatalf("leader still %s after its kill", c.Name(leader))
	}
	publish("s.2", "two")
	c.Restart(leader)
	c.Freeze(leader)
	c.Thaw(leader)
	c.StopAll()
	c.StartAll()
	// A request sent just as the servers come back may go unanswered:
	// each attempt has a timeout of its own.
	var s jetstream.Stream
	for {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		s, err = js.Stream(actx, "S")
		acancel()
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 2 {
		t.Errorf("stream has %d messages, want 2", n)
	}
}
