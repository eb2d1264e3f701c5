package kafka_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// childEnv selects the child consumer mode of the test binary: the test
// re-executes itself to get a real consumer process it can kill.
const childEnv = "IDEM_KAFKA_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childConsumer())
	}
	goleak.VerifyTestMain(m)
}

// childConsumer runs a subscriber feeding the effect consumer until killed
// or interrupted, then prints the consumer's counters. Its configuration
// comes from the environment.
func childConsumer() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("CHILD_PG_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	c, err := newEffectConsumer(postgres.NewPgx(pool), os.Getenv("CHILD_GROUP"), inbox.RetryPolicy{}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		ClientConfig: kafka.ClientConfig{Brokers: strings.Split(os.Getenv("CHILD_BROKERS"), ","), Opts: fastGroup()},
		Group:        os.Getenv("CHILD_GROUP"),
		Topics:       []string{os.Getenv("CHILD_TOPIC")},
	}, c.DeliverBatch)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := sub.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	<-ctx.Done()
	err = sub.Stop(context.Background())
	st := c.Stats()
	fmt.Printf("applied=%d duplicates=%d\n", st.Applied, st.Duplicates)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// effectTable is the table the test handlers write their effects to: one
// row per application of an event, in application order, with no unique
// key, so that a double effect shows.
const effectTable = `CREATE TABLE IF NOT EXISTS effect (
	seq bigserial PRIMARY KEY,
	event_id uuid NOT NULL,
	consumer text NOT NULL,
	aggregate_id text NOT NULL,
	version bigint NOT NULL)`

// newEffectConsumer returns a consumer whose handler inserts one effect row
// per event, after fail (if set) lets it.
func newEffectConsumer(drv *postgres.PgxDriver, name string, retry inbox.RetryPolicy, fail func(ev idem.Event) error) (*inbox.Consumer[pgx.Tx], error) {
	if _, err := drv.Pgx().Exec(context.Background(), effectTable); err != nil {
		return nil, err
	}
	c, err := inbox.New[pgx.Tx](drv, inbox.Config{Name: name, Retry: retry, Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		if fail != nil {
			if err := fail(ev); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, consumer, aggregate_id, version) VALUES ($1, $2, $3, $4)`,
			ev.ID, name, ev.AggregateID, ev.AggregateVersion)
		return err
	})
	return c, nil
}

func quietLogger() *slog.Logger {
	if flag.Parsed() && testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
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
	cfg := kafka.PublisherConfig{ClientConfig: kafka.ClientConfig{Brokers: c.ListenAddrs(), Logger: quietLogger()}}
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

// subscribe starts a subscriber and stops it when the test ends (or when the
// returned stop is called).
func subscribe(t testing.TB, c *kfake.Cluster, group string, topics []string, deliver broker.DeliverFunc, tweak ...func(*kafka.SubscriberConfig)) (*kafka.Subscriber, func()) {
	t.Helper()
	cfg := kafka.SubscriberConfig{
		ClientConfig: kafka.ClientConfig{Brokers: c.ListenAddrs(), Logger: quietLogger(), Opts: fastGroup()},
		Group:        group,
		Topics:       topics,
		RequeueDelay: 20 * time.Millisecond,
	}
	for _, f := range tweak {
		f(&cfg)
	}
	sub, err := kafka.NewSubscriber(cfg, deliver)
	if err != nil {
		t.Fatal(err)
	}
	stop := testsvc.Start(t, sub)
	return sub, stop
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

func count(t testing.TB, pg *testdb.PG, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pg.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
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
	rows, err := pg.Pool.Query(context.Background(),
		`SELECT event_id::text, aggregate_id, version FROM effect WHERE consumer = $1 ORDER BY seq`, consumer)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[string]int{}
	last := map[string]int64{}
	for rows.Next() {
		var id, agg string
		var v int64
		if err := rows.Scan(&id, &agg, &v); err != nil {
			t.Fatal(err)
		}
		seen[id]++
		if v <= last[agg] {
			t.Errorf("aggregate %s: version %d applied after version %d", agg, v, last[agg])
		}
		last[agg] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if n := seen[ev.ID.String()]; n != 1 {
			t.Errorf("event %s (aggregate %s v%d) applied %d times, want 1", ev.ID, ev.AggregateID, ev.AggregateVersion, n)
		}
	}
	if len(seen) != len(evs) {
		t.Errorf("%d distinct events applied, want %d", len(seen), len(evs))
	}
}
