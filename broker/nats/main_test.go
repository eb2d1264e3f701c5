package nats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// childEnv selects the child consumer mode of the test binary: the test
// re-executes itself to get a real consumer process it can kill.
const childEnv = "IDEM_NATS_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childConsumer())
	}
	code := testdb.RunWithExampleDatabase(m, func() error { return goleak.Find() })
	os.Exit(code)
}

// childConsumer runs a subscriber feeding the effect consumer until killed
// or interrupted. Its configuration comes from the environment.
func childConsumer() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("CHILD_PG_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	c, err := newEffectConsumer(postgres.NewPgx(pool), os.Getenv("CHILD_CONSUMER"), inbox.RetryPolicy{}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sub, err := nats.NewSubscriber(nats.SubscriberConfig{
		ConnConfig: nats.ConnConfig{URL: os.Getenv("CHILD_NATS_URL")},
		Stream:     nats.StreamConfig{Name: os.Getenv("CHILD_STREAM"), SubjectPrefix: os.Getenv("CHILD_PREFIX")},
		Consumer:   os.Getenv("CHILD_CONSUMER"),
		AckWait:    time.Second,
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
	_ = sub.Stop(context.Background())
	return 0
}

// effectTable is the table the test handlers write their effects to: one
// row per application of an event, with no unique key, so that a double
// effect shows.
const effectTable = `CREATE TABLE IF NOT EXISTS effect (event_id uuid NOT NULL, consumer text NOT NULL)`

// fastRetry retries quickly.
var fastRetry = inbox.RetryPolicy{InitialDelay: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Jitter: -1}

// newEffectConsumer returns a consumer whose handler inserts one effect row
// per event, after fail (if set) lets it.
func newEffectConsumer(drv *postgres.PgxDriver, name string, retry inbox.RetryPolicy, fail func(ev idem.Event) error) (*inbox.Consumer[pgx.Tx], error) {
	if _, err := drv.Pgx().Exec(context.Background(), effectTable); err != nil {
		return nil, err
	}
	c, err := inbox.New[pgx.Tx](drv, inbox.Config{Name: name, Retry: retry})
	if err != nil {
		return nil, err
	}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		if fail != nil {
			if err := fail(ev); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, consumer) VALUES ($1, $2)`, ev.ID, name)
		return err
	})
	return c, nil
}

// server is an embedded server on a TCP port of its own and a data
// directory, which the test can restart keeping both.
type server struct {
	dir, listen string
	srv         *embedded.Server
}

// startServer starts an embedded server listening on 127.0.0.1 and shuts it
// down at cleanup.
func startServer(t testing.TB) *server {
	t.Helper()
	s := &server{dir: t.TempDir(), listen: "127.0.0.1:0"}
	s.start(t)
	s.listen = strings.TrimPrefix(s.srv.ClientURL(), "nats://")
	t.Cleanup(func() { s.stop(t) })
	return s
}

func (s *server) start(t testing.TB) {
	t.Helper()
	srv, err := embedded.Start(context.Background(), embedded.Config{Dir: s.dir, Listen: s.listen})
	if err != nil {
		t.Fatal(err)
	}
	s.srv = srv
}

func (s *server) stop(t testing.TB) {
	t.Helper()
	if s.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	s.srv = nil
}

// restart stops the server and starts it again on the same port and data.
func (s *server) restart(t testing.TB) {
	t.Helper()
	s.stop(t)
	s.start(t)
}

func (s *server) url() string { return "nats://" + s.listen }

// names is a stream and subject prefix of a test's own.
type names struct {
	stream nats.StreamConfig
}

func newNames() names {
	r := randomHex(5)
	return names{stream: nats.StreamConfig{Name: "T" + r, SubjectPrefix: "t" + r}}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// bundle is what a subscriber test needs.
type bundle struct {
	srv   *server
	names names
	pg    *testdb.PG
	pub   *nats.Publisher
}

// setup returns a server, fresh names, a fresh schema and a publisher.
func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{srv: startServer(t), names: newNames(), pg: testdb.NewPostgres(t)}
	b.pub = newPublisher(t, b.srv.url(), b.names.stream)
	return b
}

func newPublisher(t testing.TB, url string, stream nats.StreamConfig) *nats.Publisher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{URL: url}, Stream: stream})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// subscribe starts a subscriber named consumer on the bundle's stream and
// returns a function that stops it (also called at cleanup).
func subscribe(t *testing.T, url string, stream nats.StreamConfig, consumer string, deliver broker.DeliverFunc, tweak ...func(*nats.SubscriberConfig)) func() {
	t.Helper()
	cfg := nats.SubscriberConfig{
		ConnConfig: nats.ConnConfig{URL: url, ReconnectWait: 50 * time.Millisecond},
		Stream:     stream,
		Consumer:   consumer,
	}
	for _, f := range tweak {
		f(&cfg)
	}
	sub, err := nats.NewSubscriber(cfg, deliver)
	if err != nil {
		t.Fatal(err)
	}
	stop := testsvc.Start(t, sub)
	return stop
}

func (b *bundle) subscribe(t *testing.T, consumer string, deliver broker.DeliverFunc, tweak ...func(*nats.SubscriberConfig)) func() {
	t.Helper()
	return subscribe(t, b.srv.url(), b.names.stream, consumer, deliver, tweak...)
}

// eventually polls cond every 10ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

func newMessage(t testing.TB, name, key string) idem.Message {
	t.Helper()
	ev, err := idem.NewEvent(name, "order", key, map[string]string{"order_id": key})
	if err != nil {
		t.Fatal(err)
	}
	m, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func publishAll(t testing.TB, p *nats.Publisher, msgs ...idem.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Publish(ctx, msgs); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// counter counts calls by event id.
type counter struct {
	mu sync.Mutex
	n  map[uuid.UUID]int
}

func (c *counter) inc(id uuid.UUID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[uuid.UUID]int{}
	}
	c.n[id]++
	return c.n[id]
}
