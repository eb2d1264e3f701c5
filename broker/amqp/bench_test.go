package amqp_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/procstat"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/relay"
)

// The RabbitMQ throughput measurements of docs/PERFORMANCE.md, in one run so
// that their ratios compare like with like. Each sub-benchmark moves
// benchEvents messages (run with -benchtime 1x) and reports events/s.
// Without the race detector:
//
//	IDEM_TEST_SERVERS="postgres rabbitmq" IDEM_TEST_SHELL=1 \
//	IDEM_TEST_CMD='go test -run "^$" -bench RabbitMQ -benchtime 1x -v ./broker/amqp/' \
//	bash scripts/test.sh
//
// The machine is shared and noisy, so the measures run in alternating
// rounds: each round measures (a) raw publish, (a') raw publish of messages
// with the properties the Publisher sends, (b) relay of events 20 deep per
// aggregate, (b') relay of events one per aggregate, (c) consume with
// deduplication and (d) raw consume on benchEvents events, with the cores
// the whole machine kept busy meanwhile, and the ratios are taken per
// round.
const (
	benchEvents = 20000
	benchRounds = 5
	// benchAggregates is how many aggregates the relay's events belong to:
	// 20 events each, which the relay publishes in 20 waves, the next
	// event of an aggregate only once the previous one is confirmed.
	benchAggregates = 1000
)

func BenchmarkRabbitMQ(b *testing.B) {
	var as, aps, bs, bds, cs, ds []result
	for round := 1; round <= benchRounds; round++ {
		a := benchRawPublish(b, false)
		ap := benchRawPublish(b, true)
		r := benchRelay(b, benchAggregates)
		rd := benchRelay(b, benchEvents)
		c := benchConsume(b)
		d := benchRawConsume(b)
		b.Logf("round %d: (a) raw publish %s  (a') with the relay's properties %s  (b) relay %s  (b') relay, one event per aggregate %s  (c) consume+dedup %s  (d) raw consume %s  (b)/(a) %.2f  (b)/(a') %.2f  (b')/(a') %.2f  (c)/(d) %.2f",
			round, a, ap, r, rd, c, d, r.rate/a.rate, r.rate/ap.rate, rd.rate/ap.rate, c.rate/d.rate)
		as, aps, bs, bds, cs, ds = append(as, a), append(aps, ap), append(bs, r), append(bds, rd), append(cs, c), append(ds, d)
	}
	ratio := func(x, y []result) float64 {
		rs := make([]float64, len(x))
		for i := range x {
			rs[i] = x[i].rate / y[i].rate
		}
		return median(rs)
	}
	rates := func(x []result) float64 {
		rs := make([]float64, len(x))
		for i := range x {
			rs[i] = x[i].rate
		}
		return median(rs)
	}
	cores := func(x []result) float64 {
		rs := make([]float64, len(x))
		for i := range x {
			rs[i] = x[i].cores
		}
		return median(rs)
	}
	b.ReportMetric(rates(as), "raw-publish/s")
	b.ReportMetric(rates(aps), "raw-publish-props/s")
	b.ReportMetric(ratio(bs, aps), "relay/raw-props")
	b.ReportMetric(rates(bs), "relay/s")
	b.ReportMetric(rates(bds), "relay-one-per-aggregate/s")
	b.ReportMetric(ratio(bds, aps), "relay-one-per-aggregate/raw-props")
	b.ReportMetric(rates(cs), "consume-dedup/s")
	b.ReportMetric(rates(ds), "raw-consume/s")
	b.ReportMetric(ratio(bs, as), "relay/raw")
	cpu := func(x []result) string {
		var rabbit, pg, own []float64
		for _, r := range x {
			rabbit, pg, own = append(rabbit, r.rabbit), append(pg, r.pg), append(own, r.ownProcs)
		}
		return fmt.Sprintf("RabbitMQ %.0f, PostgreSQL %.0f, this process %.0f", median(rabbit), median(pg), median(own))
	}
	b.Logf("medians: CPU ms per 1,000 events: (a') %s; (b) %s; (b') %s", cpu(aps), cpu(bs), cpu(bds))
	b.ReportMetric(cores(aps), "raw-publish-props-cores")
	b.ReportMetric(cores(bs), "relay-cores")
	b.ReportMetric(0, "ns/op")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// result is one measure: events per second, how many of the machine's
// cores were busy meanwhile (every process: the servers share the cores
// with the benchmark), and the CPU time per 1,000 events of RabbitMQ,
// PostgreSQL and the benchmark's process.
type result struct {
	rate, cores          float64
	rabbit, pg, ownProcs float64
}

func (r result) String() string {
	return fmt.Sprintf("%.0f/s (%.2f cores busy; CPU ms per 1,000: RabbitMQ %.0f, PostgreSQL %.0f, this process %.0f)",
		r.rate, r.cores, r.rabbit, r.pg, r.ownProcs)
}

// serverCPU returns the CPU time of every RabbitMQ process (the Erlang VM
// and its helpers), every PostgreSQL process, and this one. The test
// servers are the only ones on the machine in make test.
func serverCPU() (rabbit, pg, own time.Duration) {
	self := os.Getpid()
	for _, p := range procstat.All() {
		switch {
		case p.PID == self:
			own += p.Own
		case strings.HasPrefix(p.Comm, "beam") || p.Comm == "erl_child_setup" || p.Comm == "epmd" || p.Comm == "inet_gethost":
			rabbit += p.Own
		case p.Comm == "postgres":
			pg += p.Own
		}
	}
	return rabbit, pg, own
}

// measure starts the clocks of one measure of n events; its result gives
// the rate, the busy cores and each server's CPU since.
func measure(b *testing.B) func(n int) result {
	m0, err := procstat.ReadMachine()
	if err != nil {
		b.Fatal(err)
	}
	rabbit0, pg0, own0 := serverCPU()
	start := time.Now()
	return func(n int) result {
		elapsed := time.Since(start)
		m1, err := procstat.ReadMachine()
		if err != nil {
			b.Fatal(err)
		}
		rabbit1, pg1, own1 := serverCPU()
		perK := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(n) * 1000 }
		return result{
			rate: rate(n, elapsed), cores: m0.CoresBusy(m1),
			rabbit: perK(rabbit1 - rabbit0), pg: perK(pg1 - pg0), ownProcs: perK(own1 - own0),
		}
	}
}

// payload500 makes envelopes of about 500 bytes.
var payload500 = map[string]string{"note": strings.Repeat("x", 300)}

func benchEnvelope(b *testing.B, i int) idem.Message {
	return benchEnvelopeOf(b, i, benchAggregates)
}

// benchEnvelopeOf is event i of one of aggregates aggregates.
func benchEnvelopeOf(b *testing.B, i, aggregates int) idem.Message {
	ev, err := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i%aggregates), payload500)
	if err != nil {
		b.Fatal(err)
	}
	m, err := idem.NewMessage(ev)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func benchQueue(b *testing.B, url, exchange string) string {
	q := exchange + ".events"
	conn, err := amqp091.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp091.Table{"x-queue-version": int32(2)}); err != nil {
		b.Fatal(err)
	}
	if err := ch.QueueBind(q, "#", exchange, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		conn, err := amqp091.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(q, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	})
	return q
}

// rawPublish publishes bodies with amqp091-go alone: persistent, confirms,
// window in flight.
func rawPublish(b *testing.B, url, exchange string, bodies [][]byte, window int) {
	rawPublishProps(b, url, exchange, bodies, window, false)
}

// rawPublishProps is rawPublish; with props, each message also carries what
// the Publisher sends: message_id, type, the idem-key header, and the
// mandatory flag.
func rawPublishProps(b *testing.B, url, exchange string, bodies [][]byte, window int, props bool) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, window))
	inflight := 0
	acked := 0
	ctx := context.Background()
	for _, body := range bodies {
		for inflight >= window {
			c := <-confirms
			if !c.Ack {
				b.Fatal("nack")
			}
			inflight--
			acked++
		}
		pub := amqp091.Publishing{DeliveryMode: amqp091.Persistent, ContentType: "application/json", Body: body}
		if props {
			pub.MessageId = idem.NewEventID().String()
			pub.Type = "order.order.placed.v1"
			pub.Headers = amqp091.Table{amqp.HeaderKey: fmt.Sprint(acked % 1000)}
		}
		err := ch.PublishWithContext(ctx, exchange, "order.order.placed.v1", props, false, pub)
		if err != nil {
			b.Fatal(err)
		}
		inflight++
	}
	for inflight > 0 {
		if c := <-confirms; !c.Ack {
			b.Fatal("nack")
		}
		inflight--
	}
}

func bodies(b *testing.B, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = benchEnvelope(b, i).Body
	}
	return out
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

func benchRawPublish(b *testing.B, props bool) result {
	url := testamqp.URL(b)
	exchange := testamqp.Name("idem_bench_")
	benchQueue(b, url, exchange)
	bs := bodies(b, benchEvents)
	done := measure(b)
	rawPublishProps(b, url, exchange, bs, 256, props)
	return done(benchEvents)
}

func benchRawConsume(b *testing.B) result {
	url := testamqp.URL(b)
	exchange := testamqp.Name("idem_bench_")
	q := benchQueue(b, url, exchange)
	rawPublish(b, url, exchange, bodies(b, benchEvents), 256)
	conn, err := amqp091.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(256, 0, false); err != nil {
		b.Fatal(err)
	}
	done := measure(b)
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < benchEvents; i++ {
		d := <-ds
		if err := d.Ack(false); err != nil {
			b.Fatal(err)
		}
	}
	return done(benchEvents)
}

// benchRelay drains benchEvents outbox rows of aggregates aggregates to
// RabbitMQ with the relay.
func benchRelay(b *testing.B, aggregates int) result {
	url := testamqp.URL(b)
	exchange := testamqp.Name("idem_bench_")
	benchQueue(b, url, exchange)
	pg := testdb.NewPostgres(b, testdb.Options{MaxConns: 20})
	rows := make([]driver.OutboxRow, 0, 1000)
	ctx := context.Background()
	for i := 0; i < benchEvents; i++ {
		m := benchEnvelopeOf(b, i, aggregates)
		ev, _ := idem.Decode(m)
		rows = append(rows, driver.OutboxRow{ID: ev.ID, AggregateType: ev.AggregateType, AggregateID: ev.AggregateID,
			Type: ev.Name, Payload: ev.Payload, OccurredAt: ev.OccurredAt})
		if len(rows) == cap(rows) || i == benchEvents-1 {
			if err := pg.Driver.Dialect().InsertOutbox(ctx, pg.Driver.Pool(), rows); err != nil {
				b.Fatal(err)
			}
			rows = rows[:0]
		}
	}
	pg.Exec(b, "VACUUM ANALYZE outbox")
	pub, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Connect(ctx); err != nil {
		b.Fatal(err)
	}
	r, err := relay.New[pgx.Tx](pg.Driver, pub, relay.Config{StatsInterval: -1, Retention: -1, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	done := measure(b)
	if err := r.Start(ctx); err != nil {
		b.Fatal(err)
	}
	tick := time.NewTicker(2 * time.Millisecond)
	for r.Stats().Published < benchEvents {
		<-tick.C
	}
	tick.Stop()
	res := done(benchEvents)
	_ = r.Stop(ctx)
	return res
}

func benchConsume(b *testing.B) result {
	url := testamqp.URL(b)
	exchange := testamqp.Name("idem_bench_")
	q := benchQueue(b, url, exchange)
	pg := testdb.NewPostgres(b, testdb.Options{MaxConns: 20})
	msgs := make([][]byte, benchEvents)
	for i := range msgs {
		msgs[i] = benchEnvelope(b, i).Body
	}
	rawPublish(b, url, exchange, msgs, 256)
	c, err := inbox.New[pgx.Tx](pg.Driver, inbox.Config{Name: "stock", Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	c.Handle("order.order.placed.v1", func(context.Context, pgx.Tx, idem.Event) error { return nil })
	sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: url, Logger: quiet},
		Exchange:   exchange,
		Queue:      q,
		NoDeclare:  true,
	}, c.DeliverBatch)
	if err != nil {
		b.Fatal(err)
	}
	done := measure(b)
	if err := sub.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	tick := time.NewTicker(2 * time.Millisecond)
	for c.Stats().Applied < benchEvents {
		<-tick.C
	}
	tick.Stop()
	res := done(benchEvents)
	_ = sub.Stop(context.Background())
	return res
}
