package kafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

func TestMain(m *testing.M) {
	brokertest.ChildMain(newChildSubscriber)
	// What a test gives no logger of its own (brokertest.LogTo) logs nowhere.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	goleak.VerifyTestMain(m)
}

// effectConsumer returns a consumer named name on pg whose handler writes
// effects (brokertest.EffectConsumer), after fail (if set) lets it.
func effectConsumer(t testing.TB, pg *testdb.PG, name string, retry inbox.RetryPolicy, fail func(idem.Event) error) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	return brokertest.EffectConsumer(t, pg.Driver, inbox.Config{Name: name, Retry: retry}, fail)
}

// newCluster starts an in-process Kafka cluster with topics of the given
// partitions, closed when the test ends.
func newCluster(t testing.TB, partitions int32, topics ...string) *kfake.Cluster {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...)}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// freePort returns a TCP port free at the time of the call.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// fastGroup are client options that make group changes quick in tests.
func fastGroup() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(6 * time.Second),
		kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}
}

func newPublisher(t testing.TB, c *kfake.Cluster, tweak ...func(*kafka.PublisherConfig)) *kafka.Publisher {
	t.Helper()
	cfg := kafka.PublisherConfig{ClientConfig: kafka.ClientConfig{Brokers: c.ListenAddrs(), Logger: brokertest.Logger()}}
	for _, f := range tweak {
		f(&cfg)
	}
	p, err := kafka.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// subscriberConfig is the configuration of a test subscriber: quick group
// changes and requeues.
func subscriberConfig(addrs []string, group string, topics ...string) kafka.SubscriberConfig {
	return kafka.SubscriberConfig{
		ClientConfig: kafka.ClientConfig{Brokers: addrs, Logger: brokertest.Logger(), Opts: fastGroup()},
		Group:        group,
		Topics:       topics,
		RequeueDelay: 20 * time.Millisecond,
	}
}

// newSubscriber returns a test subscriber, not started.
func newSubscriber(t testing.TB, c *kfake.Cluster, group string, topics []string, deliver broker.DeliverFunc, tweak ...func(*kafka.SubscriberConfig)) *kafka.Subscriber {
	t.Helper()
	cfg := subscriberConfig(c.ListenAddrs(), group, topics...)
	for _, f := range tweak {
		f(&cfg)
	}
	sub, err := kafka.NewSubscriber(cfg, deliver)
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// subscribe starts a subscriber and stops it when the test ends (or when the
// returned stop is called).
func subscribe(t testing.TB, c *kfake.Cluster, group string, topics []string, deliver broker.DeliverFunc, tweak ...func(*kafka.SubscriberConfig)) (*kafka.Subscriber, func()) {
	t.Helper()
	sub := newSubscriber(t, c, group, topics, deliver, tweak...)
	return sub, testsvc.Start(t, sub)
}

// committed returns the group's committed offsets of topic, by partition.
func committed(t testing.TB, c *kfake.Cluster, group, topic string) map[int32]int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch offsets of %s: %v", group, err)
	}
	out := map[int32]int64{}
	for p, o := range offs[topic] {
		if o.Err == nil {
			out[p] = o.At
		}
	}
	return out
}

// newEvents returns n events of aggregate type "order" over keys aggregates,
// with versions counting from 1 per aggregate.
func newEvents(t testing.TB, n, keys int) []idem.Event {
	t.Helper()
	versions := map[string]int64{}
	evs := make([]idem.Event, n)
	for i := range evs {
		key := fmt.Sprintf("%d", i%keys)
		ev, err := idem.NewEvent("order.order.changed.v1", "order", key, map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		versions[key]++
		ev.AggregateVersion = versions[key]
		evs[i] = ev
	}
	return evs
}

func messages(t testing.TB, evs []idem.Event) []idem.Message {
	t.Helper()
	msgs := make([]idem.Message, len(evs))
	for i, ev := range evs {
		m, err := idem.NewMessage(ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = m
	}
	return msgs
}

// checkOnceInOrder checks that every event has exactly one effect and that
// each aggregate's effects were applied in version order.
func checkOnceInOrder(t testing.TB, pg *testdb.PG, consumer string, evs []idem.Event) {
	t.Helper()
	brokertest.CheckOnceInOrder(t, pg, consumer, messages(t, evs))
}
