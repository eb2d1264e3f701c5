package outage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// outageFor is how long each dependency stays away.
const outageFor = 30 * time.Second

// resumeWithin is how soon after a dependency's return consumption must
// resume.
const resumeWithin = 5 * time.Second

const eventName = "order.order.changed.v1"

// effectTable records every application of an event, in order, with the
// database's clock: no unique key, so that a double effect shows.
const effectTable = `CREATE TABLE effect (
    seq        bigserial   PRIMARY KEY,
    event_id   uuid        NOT NULL,
    aggregate  text        NOT NULL,
    n          integer     NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`

func logger() *slog.Logger {
	if os.Getenv("IDEM_TEST_VERBOSE") != "" {
		return slog.Default()
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// pipe is one consumer on its own schema, fed by one transport.
type pipe struct {
	name    string
	pg      *testdb.PG
	pub     broker.Publisher
	cons    *inbox.Consumer[pgx.Tx]
	sent    []idem.Message
	perAggr map[string]int
}

// newConsumer returns an effect consumer on pg; before, when set, runs
// first in the handler.
func newConsumer(t *testing.T, pg *testdb.PG, name string, before func(ctx context.Context, ev idem.Event) error) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	pg.Exec(t, effectTable)
	c, err := inbox.New(pg.Driver, inbox.Config{Name: name, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(eventName, func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		if before != nil {
			if err := before(ctx, ev); err != nil {
				return err
			}
		}
		var p struct{ N int }
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			return idem.Permanent(err)
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, aggregate, n) VALUES ($1, $2, $3)`, ev.ID, ev.AggregateID, p.N)
		return err
	})
	return c
}

// publish sends n events spread over 20 aggregates, numbered per aggregate.
func (p *pipe) publish(t *testing.T, n int) {
	t.Helper()
	if p.perAggr == nil {
		p.perAggr = map[string]int{}
	}
	var msgs []idem.Message
	for i := range n {
		agg := "order-" + strconv.Itoa(i%20)
		p.perAggr[agg]++
		ev, err := idem.NewEvent(eventName, "order", agg, map[string]int{"n": p.perAggr[agg]})
		if err != nil {
			t.Fatal(err)
		}
		m, err := idem.NewMessage(ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.pub.Publish(ctx, msgs); err != nil {
		t.Fatalf("%s: publish: %v", p.name, err)
	}
	p.sent = append(p.sent, msgs...)
}

func (p *pipe) applied(t *testing.T) int { return p.pg.Count(t, "effect") }

// check verifies that every event sent was applied exactly once, in order
// per aggregate, that nothing was parked and no attempt counted, and
// returns the first application after since.
func (p *pipe) check(t *testing.T, since time.Time) time.Time {
	t.Helper()
	if n, d := p.pg.Count(t, "effect"), p.pg.Count(t, "(SELECT DISTINCT event_id FROM effect) d"); n != len(p.sent) || d != len(p.sent) {
		t.Errorf("%s: %d effects of %d distinct events; want each of the %d events once", p.name, n, d, len(p.sent))
	}
	if n := p.pg.Count(t, "failed_message"); n != 0 {
		t.Errorf("%s: %d message(s) parked by an outage; want none", p.name, n)
	}
	if n := p.pg.Count(t, "delivery_attempt"); n != 0 {
		t.Errorf("%s: %d event(s) with failed attempts counted during an outage; want none", p.name, n)
	}
	rows, err := p.pg.Pool.Query(context.Background(), `SELECT aggregate, n FROM effect ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	for rows.Next() {
		var agg string
		var n int
		if err := rows.Scan(&agg, &n); err != nil {
			t.Fatal(err)
		}
		if n != last[agg]+1 {
			t.Errorf("%s: aggregate %s applied event %d after %d: out of order", p.name, agg, n, last[agg])
		}
		last[agg] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var first time.Time
	if err := p.pg.Pool.QueryRow(context.Background(), `SELECT min(applied_at) FROM effect WHERE applied_at > $1`, since).Scan(&first); err != nil {
		t.Fatalf("%s: no effect after the dependency came back: %v", p.name, err)
	}
	return first
}

// resumed checks that p applied something within resumeWithin of back.
func (p *pipe) resumed(t *testing.T, back time.Time) {
	t.Helper()
	first := p.check(t, back)
	delay := first.Sub(back)
	t.Logf("%s: resumed %v after the dependency came back", p.name, delay.Round(time.Millisecond))
	if delay > resumeWithin {
		t.Errorf("%s: resumed %v after the dependency came back; want within %v", p.name, delay.Round(time.Millisecond), resumeWithin)
	}
}

func subscribeAMQP(t *testing.T, url string, c *inbox.Consumer[pgx.Tx]) broker.Publisher {
	t.Helper()
	exchange := testamqp.Name("idem_outage_")
	pub, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url, Logger: logger()}, Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: url, Logger: logger()},
		Exchange:   exchange, Queue: exchange + ".q", Bindings: []string{"order.#"},
	}, c.DeliverBatch)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)
	return pub
}

func subscribeNATS(t *testing.T, c *inbox.Consumer[pgx.Tx]) broker.Publisher {
	t.Helper()
	srv, err := embedded.Start(context.Background(), embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	conn := func() nats.ConnConfig {
		nc, err := srv.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nats.ConnConfig{Conn: nc, Logger: logger()}
	}
	pub, err := nats.NewPublisher(context.Background(), nats.PublisherConfig{ConnConfig: conn()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	sub, err := nats.NewSubscriber(nats.SubscriberConfig{ConnConfig: conn(), Consumer: c.Name()}, c.DeliverBatch)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)
	return pub
}

func subscribeKafka(t *testing.T, c *inbox.Consumer[pgx.Tx]) broker.Publisher {
	t.Helper()
	cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "outbox.event.order"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	cc := kafka.ClientConfig{Brokers: cl.ListenAddrs(), Logger: logger()}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{ClientConfig: cc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{ClientConfig: cc, Group: c.Name(), Topics: []string{"outbox.event.order"}}, c.DeliverBatch)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)
	return pub
}

// The consumer's PostgreSQL is stopped for 30 seconds while events keep
// arriving on RabbitMQ, NATS and Kafka: the consumers pause, park nothing,
// count no attempt, and apply everything once, in order, within seconds of
// the database's return.
func TestConsumerDatabaseOutage(t *testing.T) {
	testdb.PostgresExclusive(t)
	amqpURL := testamqp.URL(t)
	var pipes []*pipe
	for _, tr := range []string{"amqp", "nats", "kafka"} {
		p := &pipe{name: tr, pg: testdb.NewPostgres(t)}
		p.cons = newConsumer(t, p.pg, "outage-"+tr, nil)
		switch tr {
		case "amqp":
			p.pub = subscribeAMQP(t, amqpURL, p.cons)
		case "nats":
			p.pub = subscribeNATS(t, p.cons)
		case "kafka":
			p.pub = subscribeKafka(t, p.cons)
		}
		pipes = append(pipes, p)
	}
	for _, p := range pipes {
		p.publish(t, 200)
	}
	for _, p := range pipes {
		testsvc.WaitFor(t, 60*time.Second, p.name+": first events applied", func() bool { return p.applied(t) == len(p.sent) })
	}

	testdb.StopPostgres(t)
	// Whatever happens, the server is up again before the schemas are
	// dropped and the next test runs.
	t.Cleanup(func() { testdb.StartPostgres(t) })
	stopped := time.Now()
	for time.Since(stopped) < outageFor {
		for _, p := range pipes {
			p.publish(t, 20)
		}
		time.Sleep(time.Second) // events keep arriving during the outage
	}
	for _, p := range pipes {
		if st := p.cons.Stats(); st.PausedSince.IsZero() {
			t.Errorf("%s: consumer not paused while its database is down (stats %+v)", p.name, st)
		}
	}
	testdb.StartPostgres(t)
	back := time.Now()
	for _, p := range pipes {
		testsvc.WaitFor(t, 60*time.Second, p.name+": every event applied after the outage", func() bool { return p.applied(t) >= len(p.sent) })
	}
	for _, p := range pipes {
		p.resumed(t, back)
	}
}

// RabbitMQ is stopped for 30 seconds with a backlog in the queue: the
// subscriber reconnects, nothing is parked, every event is applied once,
// and consumption resumes within seconds of the broker's return.
func TestBrokerOutage(t *testing.T) {
	url := testamqp.Exclusive(t)
	p := &pipe{name: "amqp", pg: testdb.NewPostgres(t)}
	var slow atomic.Bool
	slow.Store(true)
	p.cons = newConsumer(t, p.pg, "outage-broker", func(ctx context.Context, ev idem.Event) error {
		if slow.Load() {
			time.Sleep(20 * time.Millisecond) // keep a backlog in the queue
		}
		return nil
	})
	p.pub = subscribeAMQP(t, url, p.cons)
	p.publish(t, 2000)
	testsvc.WaitFor(t, 30*time.Second, "some events applied", func() bool { return p.applied(t) > 100 })
	testamqp.Stop(t)
	t.Cleanup(func() { testamqp.Start(t) })
	time.Sleep(outageFor) // the broker is away
	slow.Store(false)
	testamqp.Start(t)
	back := time.Now()
	testsvc.WaitFor(t, 90*time.Second, "every event applied after the outage", func() bool { return p.applied(t) >= len(p.sent) })
	p.resumed(t, back)
}

// A downstream HTTP service answers 503 for 15 seconds, then refuses
// connections for 15 seconds, while events arrive: nothing is parked,
// every event is applied once, in order, within seconds of its return.
func TestDownstreamOutage(t *testing.T) {
	var down atomic.Bool
	svc := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	svc.Listener = l
	svc.Start()
	var mu sync.Mutex
	current := svc
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if current != nil {
			current.Close()
		}
	})

	client := &http.Client{Timeout: 5 * time.Second}
	call := func(ctx context.Context, ev idem.Event) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/pickups", nil)
		resp, err := client.Do(req)
		if err != nil {
			return err // a refused connection is recognised as transient
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 500 {
			return idem.Transient(fmt.Errorf("pickup service: %s", resp.Status))
		}
		return nil
	}
	amqpURL := testamqp.URL(t)
	p := &pipe{name: "amqp", pg: testdb.NewPostgres(t)}
	p.cons = newConsumer(t, p.pg, "outage-downstream", call)
	p.pub = subscribeAMQP(t, amqpURL, p.cons)
	p.publish(t, 100)
	testsvc.WaitFor(t, 30*time.Second, "first events applied", func() bool { return p.applied(t) == len(p.sent) })

	down.Store(true)
	start := time.Now()
	for time.Since(start) < outageFor {
		if time.Since(start) >= outageFor/2 {
			mu.Lock()
			if current != nil {
				current.Close() // from now on, connections are refused
				current = nil
			}
			mu.Unlock()
		}
		p.publish(t, 10)
		time.Sleep(time.Second)
	}
	down.Store(false)
	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	mu.Lock()
	current = httptest.NewUnstartedServer(svc.Config.Handler)
	current.Listener = l2
	current.Start()
	mu.Unlock()
	back := time.Now()
	testsvc.WaitFor(t, 60*time.Second, "every event applied after the outage", func() bool { return p.applied(t) >= len(p.sent) })
	p.resumed(t, back)
}

// A NATS server (not embedded in the consumer's process) is stopped for 10
// seconds and started again on the same port and data: the client
// reconnects, the subscriber consumes again within seconds, nothing is lost
// or parked.
func TestNATSServerOutage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := func(listen string) *embedded.Server {
		srv, err := embedded.Start(context.Background(), embedded.Config{Dir: dir, Listen: listen, SyncAlways: true})
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	srv := start("127.0.0.1:0")
	addr := strings.TrimPrefix(srv.ClientURL(), "nats://")
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })

	p := &pipe{name: "nats", pg: testdb.NewPostgres(t)}
	p.cons = newConsumer(t, p.pg, "outage-nats-server", nil)
	cc := nats.ConnConfig{URL: srv.ClientURL(), Logger: logger()}
	pub, err := nats.NewPublisher(context.Background(), nats.PublisherConfig{ConnConfig: cc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	p.pub = pub
	sub, err := nats.NewSubscriber(nats.SubscriberConfig{ConnConfig: cc, Consumer: p.cons.Name()}, p.cons.DeliverBatch)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)
	p.publish(t, 100)
	testsvc.WaitFor(t, 30*time.Second, "first events applied", func() bool { return p.applied(t) == len(p.sent) })

	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second) // the broker is away
	srv = start(addr)
	back := time.Now()
	probe, err := idem.NewEvent(eventName, "order", "probe", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	pm, err := idem.NewMessage(probe)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 30*time.Second, "a publish accepted again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return pub.Publish(ctx, []idem.Message{pm}) == nil
	})
	p.sent = append(p.sent, pm)
	p.publish(t, 100)
	testsvc.WaitFor(t, 60*time.Second, "every event applied after the outage", func() bool { return p.applied(t) >= len(p.sent) })
	p.resumed(t, back)
}
