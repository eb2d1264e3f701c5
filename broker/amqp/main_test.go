package amqp_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// childEnv selects the child consumer mode of the test binary: the test
// re-executes itself to get a real consumer process it can kill.
const childEnv = "IDEM_AMQP_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childConsumer())
	}
	goleak.VerifyTestMain(m)
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
	sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: os.Getenv("CHILD_AMQP_URL")},
		Exchange:   os.Getenv("CHILD_EXCHANGE"),
		Queue:      os.Getenv("CHILD_QUEUE"),
		Bindings:   []string{"#"},
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
const effectTable = `CREATE TABLE IF NOT EXISTS effect (event_id uuid NOT NULL, consumer text NOT NULL, attempt text NOT NULL DEFAULT '')`

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
		attempt := ev.Headers[idem.HeaderAttempt]
		if attempt == "" {
			attempt = "1"
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, consumer, attempt) VALUES ($1, $2, $3)`, ev.ID, name, attempt)
		return err
	})
	return c, nil
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
	b := &bundle{
		url:      testamqp.URL(t),
		exchange: testamqp.Name("idem_t_"),
		pg:       testdb.NewPostgres(t),
	}
	b.queue = b.exchange + ".events"
	b.pub = newPublisher(t, b.url, b.exchange)
	return b
}

func newPublisher(t *testing.T, url, exchange string) *amqp.Publisher {
	t.Helper()
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// subscribe starts a subscriber on the bundle's queue, bound to "#", and
// stops it at cleanup.
func (b *bundle) subscribe(t *testing.T, deliver broker.DeliverFunc, tweak ...func(*amqp.SubscriberConfig)) *amqp.Subscriber {
	t.Helper()
	cfg := amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: b.url, ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second},
		Exchange:   b.exchange,
		Queue:      b.queue,
		Bindings:   []string{"#"},
	}
	for _, f := range tweak {
		f(&cfg)
	}
	sub, err := amqp.NewSubscriber(cfg, deliver)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)
	return sub
}

// declareQueue declares the bundle's queue and binding without consuming,
// so that messages published before a subscriber starts are kept.
func (b *bundle) declareQueue(t *testing.T) {
	t.Helper()
	withChannel(t, b.url, func(ch *amqp091.Channel) {
		if err := ch.ExchangeDeclare(b.exchange, "topic", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(b.queue, true, false, false, false, amqp091.Table{"x-queue-version": int32(2)}); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(b.queue, "#", b.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	})
}

// withChannel runs f on a fresh connection's channel.
func withChannel(t *testing.T, url string, f func(ch *amqp091.Channel)) {
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

func publishAll(t *testing.T, p *amqp.Publisher, msgs ...idem.Message) {
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

var _ = atomic.Int64{}
