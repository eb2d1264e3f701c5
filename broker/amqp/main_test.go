package amqp_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

func TestMain(m *testing.M) {
	brokertest.ChildMain(newChildSubscriber)
	// What a test gives no logger of its own (brokertest.LogTo) logs nowhere.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	goleak.VerifyTestMain(m)
}

// bundle is what a subscriber test needs.
type bundle struct {
	url      string
	exchange string
	queue    string
	pg       *testdb.PG
	pub      *amqp.Publisher
}

// setup returns a fresh schema, exchange and queue name, and a publisher.
func setup(t *testing.T) *bundle {
	t.Helper()
	return newBundle(t, testamqp.URL(t))
}

func newBundle(t *testing.T, url string) *bundle {
	t.Helper()
	b := &bundle{url: url, exchange: testamqp.Name("idem_t_"), pg: testdb.NewPostgres(t)}
	b.queue = b.exchange + ".events"
	b.pub = newPublisher(t, b.url, b.exchange)
	return b
}

// consumer returns a consumer named stock on the bundle's schema, writing
// effects (brokertest.EffectConsumer), failing as fail says.
func (b *bundle) consumer(t *testing.T, fail func(idem.Event) error) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	return brokertest.EffectConsumer(t, b.pg.Driver, inbox.Config{Name: "stock", Retry: fastRetry}, fail)
}

func newPublisher(t testing.TB, url, exchange string) *amqp.Publisher {
	t.Helper()
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// subscriberConfig is the configuration of a test subscriber on queue,
// bound to bindings, with one worker.
func subscriberConfig(url, exchange, queue string, bindings ...string) amqp.SubscriberConfig {
	return amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: url, ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second},
		Exchange:   exchange,
		Queue:      queue,
		Bindings:   bindings,
		Workers:    1,
	}
}

func newSubscriber(t testing.TB, cfg amqp.SubscriberConfig, deliver broker.DeliverFunc) *amqp.Subscriber {
	t.Helper()
	sub, err := amqp.NewSubscriber(cfg, deliver)
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// subscribe starts a subscriber on the bundle's queue, bound to "#", and
// stops it at cleanup.
func (b *bundle) subscribe(t *testing.T, deliver broker.DeliverFunc, tweak ...func(*amqp.SubscriberConfig)) {
	t.Helper()
	cfg := subscriberConfig(b.url, b.exchange, b.queue, "#")
	cfg.Workers = 0 // the default
	for _, f := range tweak {
		f(&cfg)
	}
	testsvc.Start(t, newSubscriber(t, cfg, deliver))
}

// declareQueue declares the bundle's queue and binding without consuming,
// so that messages published before a subscriber starts are kept.
func (b *bundle) declareQueue(t *testing.T) {
	t.Helper()
	declare(t, b.url, b.exchange, []string{b.queue}, []string{"#"})
}

// declare declares exchange and durable queues bound to it with bindings,
// as a deployment where each service declares its queue.
func declare(t testing.TB, url, exchange string, queues, bindings []string) {
	t.Helper()
	withChannel(t, url, func(ch *amqp091.Channel) {
		if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		for _, q := range queues {
			if _, err := ch.QueueDeclare(q, true, false, false, false, amqp091.Table{"x-queue-version": int32(2)}); err != nil {
				t.Fatal(err)
			}
			for _, b := range bindings {
				if err := ch.QueueBind(q, b, exchange, false, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// withChannel runs f on a fresh connection's channel.
func withChannel(t testing.TB, url string, f func(ch *amqp091.Channel)) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	f(ch)
}

// queueDepth returns the number of ready messages in queue.
func queueDepth(t *testing.T, url, queue string) int {
	t.Helper()
	var n int
	withChannel(t, url, func(ch *amqp091.Channel) {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("inspect queue %s: %v", queue, err)
		}
		n = q.Messages
	})
	return n
}
