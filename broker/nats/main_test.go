package nats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

func TestMain(m *testing.M) {
	brokertest.ChildMain(newChildSubscriber)
	orderChildMain()
	// What a test gives no logger of its own (brokertest.LogTo) logs nowhere.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	code := testdb.RunWithExampleDatabase(m, func() error { return goleak.Find() })
	os.Exit(code)
}

// fastRetry retries quickly.
var fastRetry = inbox.RetryPolicy{InitialDelay: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Jitter: -1}

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
