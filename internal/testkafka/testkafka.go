// Package testkafka starts Kafka for tests whose clients run in other
// processes: franz-go's in-process kfake cluster, listening on a TCP port.
package testkafka

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Start starts a kfake cluster of one broker listening on a local TCP port,
// with topics created on first use in 2 partitions, stopped when the test
// ends, and returns its kafka:// URL. The members of its groups whose
// process died are made to leave after their session timeout, as a Kafka
// broker's are (sessions.go).
func Start(t testing.TB) string {
	t.Helper()
	url, stop, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return url
}

// Listen starts the cluster Start starts, for a program that is not a
// test (shopctl chaos --broker kfake), and returns its URL and the
// function that stops it.
func Listen() (url string, stop func(), err error) {
	// No port of ours: kfake listens on 127.0.0.1:0, and the kernel picks
	// one no other process holds (a port found free, then bound, could
	// be taken in between).
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2))
	if err != nil {
		return "", nil, err
	}
	done := make(chan struct{})
	if err := watchSessions(c, done); err != nil {
		c.Close()
		return "", nil, err
	}
	stop = func() {
		close(done)
		c.Close()
	}
	return "kafka://" + c.ListenAddrs()[0], stop, nil
}
