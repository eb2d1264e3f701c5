package amqp_test

import (
	"context"
	"fmt"
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
// The machine is shared and noisy, so the four measures run in alternating
// rounds: each round measures (a) raw publish, (a') raw publish of messages
// with the properties the Publisher sends, (b) relay, (c) consume with
// deduplication and (d) raw consume on benchEvents events, and the ratios
// are taken per round.
const (
	benchEvents = 20000
	benchRounds = 5
)

func BenchmarkRabbitMQ(b *testing.B) {
	var as, aps, bs, cs, ds []float64
	for round := 1; round <= benchRounds; round++ {
		a := benchRawPublish(b, false)
		ap := benchRawPublish(b, true)
		r := benchRelay(b)
		c := benchConsume(b)
		d := benchRawConsume(b)
		b.Logf("round %d: (a) raw publish %.0f/s  (a') with the relay's properties %.0f/s  (b) relay %.0f/s  (c) consume+dedup %.0f/s  (d) raw consume %.0f/s  (b)/(a) %.2f  (b)/(a') %.2f  (c)/(d) %.2f",
			round, a, ap, r, c, d, r/a, r/ap, c/d)
		as, aps, bs, cs, ds = append(as, a), append(aps, ap), append(bs, r), append(cs, c), append(ds, d)
	}
	ratios := make([]float64, len(as))
	propRatios := make([]float64, len(as))
	for i := range as {
		ratios[i] = bs[i] / as[i]
		propRatios[i] = bs[i] / aps[i]
	}
	b.ReportMetric(median(as), "raw-publish/s")
	b.ReportMetric(median(aps), "raw-publish-props/s")
	b.ReportMetric(median(propRatios), "relay/raw-props")
	b.ReportMetric(median(bs), "relay/s")
	b.ReportMetric(median(cs), "consume-dedup/s")
	b.ReportMetric(median(ds), "raw-consume/s")
	b.ReportMetric(median(ratios), "relay/raw")
	b.ReportMetric(0, "ns/op")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// payload500 makes envelopes of about 500 bytes.
var payload500 = map[string]string{"note": strings.Repeat("x", 300)}

func benchEnvelope(b *testing.B, i int) idem.Message {
	ev, err := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i%1000), payload500)
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

func benchRawPublish(b *testing.B, props bool) float64 {
	url := testamqp.URL(b)
	exchange := testamqp.Name("idem_bench_")
	benchQueue(b, url, exchange)
	bs := bodies(b, benchEvents)
	start := time.Now()
	rawPublishProps(b, url, exchange, bs, 256, props)
	return rate(benchEvents, time.Since(start))
}

func benchRawConsume(b *testing.B) float64 {
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
	start := time.Now()
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
	return rate(benchEvents, time.Since(start))
}

func benchRelay(b *testing.B) float64 {
	url := testamqp.URL(b)
	exchange := testamqp.Name("idem_bench_")
	benchQueue(b, url, exchange)
	pg := testdb.NewPostgres(b, testdb.Options{MaxConns: 20})
	rows := make([]driver.OutboxRow, 0, 1000)
	ctx := context.Background()
	for i := 0; i < benchEvents; i++ {
		m := benchEnvelope(b, i)
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
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		b.Fatal(err)
	}
	tick := time.NewTicker(2 * time.Millisecond)
	for r.Stats().Published < benchEvents {
		<-tick.C
	}
	tick.Stop()
	res := rate(benchEvents, time.Since(start))
	_ = r.Stop(ctx)
	return res
}

func benchConsume(b *testing.B) float64 {
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
	start := time.Now()
	if err := sub.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	tick := time.NewTicker(2 * time.Millisecond)
	for c.Stats().Applied < benchEvents {
		<-tick.C
	}
	tick.Stop()
	res := rate(benchEvents, time.Since(start))
	_ = sub.Stop(context.Background())
	return res
}
