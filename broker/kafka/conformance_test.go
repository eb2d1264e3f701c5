package kafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/internal/fault"
)

// restartable is a kfake cluster that keeps its data in a directory and can
// be restarted on the same port.
type restartable struct {
	mu   sync.Mutex
	dir  string
	port int
	c    *kfake.Cluster
}

func (r *restartable) start(t testing.TB) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(r.port), kfake.DataDir(r.dir), kfake.SyncWrites())
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
	r := &restartable{dir: t.TempDir(), port: freePort(t)}
	r.start(t)
	t.Cleanup(func() { r.cluster().Close() })
	brokertest.Run(t, brokertest.Transport{
		New: func(t *testing.T, o brokertest.Options) brokertest.Instance { return newConformanceInstance(t, r, o) },
		Features: brokertest.Features{
			PerKeyOrder:         true,
			Redeliver:           true,
			RedeliverReachesAll: true,
			DeadLetter:          true,
			Inspect:             true,
			Restart: func(t *testing.T) {
				r.cluster().Close()
				r.start(t)
			},
			ProcessKill: fault.KafkaAfterHandleBeforeCommit,
		},
	})
}

// newConformanceInstance gives each test topics of its own on the shared
// cluster, <prefix>test (three partitions) and its dead-letter topic, and a
// consumer group per consumer.
func newConformanceInstance(t *testing.T, r *restartable, o brokertest.Options) brokertest.Instance {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "t" + hex.EncodeToString(b) + "."
	topic := prefix + "test"
	dlq := topic + kafka.DeadLetterSuffixDefault
	addrs := r.cluster().ListenAddrs()
	withAdmin(t, addrs, func(ctx context.Context, adm *kadm.Client) {
		res, err := adm.CreateTopics(ctx, 3, 1, nil, topic, dlq)
		if err == nil {
			err = res.Error()
		}
		if err != nil {
			t.Fatalf("create topics: %v", err)
		}
	})
	var (
		mu   sync.Mutex
		subs = map[string]*kafka.Subscriber{}
	)
	return brokertest.Instance{
		Publisher: newPublisher(t, r.cluster(), func(cfg *kafka.PublisherConfig) {
			cfg.TopicReplacement = prefix + kafka.RoutedByValue
			cfg.GroupOf = func(consumer string) string { return prefix + consumer }
		}),
		NewSubscriber: func(t *testing.T, consumer string, deliver broker.DeliverFunc) broker.Subscriber {
			sub := newSubscriber(t, r.cluster(), prefix+consumer, []string{topic}, deliver, func(cfg *kafka.SubscriberConfig) {
				cfg.TopicPrefix = prefix
				cfg.Logger = brokertest.LogTo(t)
				cfg.DeadLetter = o.DeadLetterAfter > 0
				cfg.DeadLetterAfter = o.DeadLetterAfter
			})
			mu.Lock()
			subs[consumer] = sub
			mu.Unlock()
			return sub
		},
		PublishRaw: func(t *testing.T, _ string, body []byte, headers map[string]string) {
			rec := &kgo.Record{Topic: topic, Value: body}
			for k, v := range headers {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
			}
			produce(t, addrs, rec)
		},
		Backlog: func(t *testing.T, consumer string) int {
			var n int64
			done := committed(t, r.cluster(), prefix+consumer, topic)
			withAdmin(t, addrs, func(ctx context.Context, adm *kadm.Client) {
				ends, err := adm.ListEndOffsets(ctx, topic)
				if err != nil {
					t.Fatalf("end offsets of %s: %v", topic, err)
				}
				ends.Each(func(o kadm.ListedOffset) { n += o.Offset - done[o.Partition] })
			})
			return int(n)
		},
		DeadLetters: func(t *testing.T, consumer string) []idem.Message {
			var n int64
			withAdmin(t, addrs, func(ctx context.Context, adm *kadm.Client) {
				ends, err := adm.ListEndOffsets(ctx, dlq)
				if err != nil {
					t.Fatalf("end offsets of %s: %v", dlq, err)
				}
				ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
			})
			mu.Lock()
			sub := subs[consumer]
			mu.Unlock()
			// Only once the subscriber counted them.
			if n == 0 || sub == nil || sub.Stats().DeadLettered < uint64(n) {
				return nil
			}
			if st := sub.Stats(); st.DeadLettered != uint64(n) || st.Retries != uint64(n)*uint64(o.DeadLetterAfter-1) {
				t.Errorf("subscriber stats: %d dead-lettered, %d retries; want %d and %d", st.DeadLettered, st.Retries, n, n*int64(o.DeadLetterAfter-1))
			}
			var out []idem.Message
			for _, rec := range readAll(t, r.cluster(), dlq, int(n)) {
				if header(rec, kafka.HeaderDLQError) == "" || header(rec, kafka.HeaderDLQTopic) != topic ||
					header(rec, kafka.HeaderDLQAttempts) != strconv.Itoa(o.DeadLetterAfter) ||
					header(rec, kafka.HeaderDLQPartition) == "" || header(rec, kafka.HeaderDLQOffset) == "" {
					t.Errorf("dead-letter record headers %v: want the error, its topic %s, partition, offset and %d attempts", rec.Headers, topic, o.DeadLetterAfter)
				}
				m := idem.Message{Key: rec.Key, Body: rec.Value, Headers: map[string]string{}}
				for _, h := range rec.Headers {
					m.Headers[h.Key] = string(h.Value)
				}
				m.EventID, _ = uuid.Parse(m.Headers[idem.HeaderEventID])
				m.EventName = m.Headers[idem.HeaderEventType]
				out = append(out, m)
			}
			return out
		},
		ChildSpec: func(consumer string) any {
			return childSpec{Brokers: addrs, Group: prefix + consumer, Topic: topic, TopicPrefix: prefix}
		},
	}
}

// withAdmin runs f with an admin client on addrs.
func withAdmin(t testing.TB, addrs []string, f func(ctx context.Context, adm *kadm.Client)) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f(ctx, kadm.NewClient(cl))
}

// produce produces records with a plain client.
func produce(t testing.TB, addrs []string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// childSpec is how the suite's child process subscribes.
type childSpec struct {
	Brokers     []string `json:"brokers"`
	Group       string   `json:"group"`
	Topic       string   `json:"topic"`
	TopicPrefix string   `json:"topic_prefix"`
}

// newChildSubscriber is the subscriber of the suite's child process
// (brokertest.ChildMain), which hits fault.KafkaAfterHandleBeforeCommit
// itself.
func newChildSubscriber(spec json.RawMessage, deliver broker.DeliverFunc) (broker.Subscriber, error) {
	var s childSpec
	if err := json.Unmarshal(spec, &s); err != nil {
		return nil, err
	}
	cfg := subscriberConfig(s.Brokers, s.Group, s.Topic)
	cfg.TopicPrefix = s.TopicPrefix
	return kafka.NewSubscriber(cfg, deliver)
}
