package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/relay"
)

// The Kafka throughput measurements of docs/PERFORMANCE.md, in one run so
// that their ratios compare like with like. Each sub-benchmark moves
// benchEvents events once (run with -benchtime 1x) through a kfake cluster
// of one broker and a topic of 8 partitions, and reports events/s. Without
// the race detector:
//
//	IDEM_TEST_SHELL=1 \
//	IDEM_TEST_CMD='go test -run "^$" -bench Kafka -benchtime 1x -count 3 ./broker/kafka/' \
//	bash scripts/test.sh
const (
	benchEvents     = 50000
	benchTopic      = "outbox.event.order"
	benchPartitions = 8
)

func BenchmarkKafka(b *testing.B) {
	b.Run("RawProduce", benchRawProduce)
	b.Run("PublisherCalls100", benchPublisher)
	b.Run("RelayOutboxToKafka", benchRelay)
	b.Run("ConsumeDedupBatch", benchConsume)
}

// payload500 makes envelopes of about 500 bytes.
var payload500 = map[string]string{"note": strings.Repeat("x", 300)}

func benchMessages(b *testing.B, n int) []idem.Message {
	out := make([]idem.Message, n)
	for i := range out {
		ev, err := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i%1000), payload500)
		if err != nil {
			b.Fatal(err)
		}
		if out[i], err = idem.NewMessage(ev); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

func benchReport(b *testing.B, n int, d time.Duration) {
	b.ReportMetric(float64(n)/d.Seconds(), "events/s")
	b.ReportMetric(0, "ns/op")
}

// rawProduce produces msgs with franz-go alone, as the Publisher would
// (topic, key, headers, idempotent, acks=all), all in flight at once.
func rawProduce(b *testing.B, brokers []string, msgs []idem.Message) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	wg.Add(len(msgs))
	for _, m := range msgs {
		rec := &kgo.Record{Topic: benchTopic, Key: m.Key, Value: m.Body, Headers: []kgo.RecordHeader{
			{Key: idem.HeaderEventID, Value: []byte(m.EventID.String())},
			{Key: idem.HeaderEventType, Value: []byte(m.EventName)},
		}}
		cl.Produce(context.Background(), rec, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				first = err
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

func benchRawProduce(b *testing.B) {
	c := newCluster(b, benchPartitions, benchTopic)
	msgs := benchMessages(b, benchEvents)
	b.ResetTimer()
	start := time.Now()
	rawProduce(b, c.ListenAddrs(), msgs)
	benchReport(b, benchEvents, time.Since(start))
}

// benchPublisher publishes through Publisher alone, in sequential calls of
// 100 messages, each returning once its records are acknowledged.
func benchPublisher(b *testing.B) {
	c := newCluster(b, benchPartitions, benchTopic)
	msgs := benchMessages(b, benchEvents)
	pub := newPublisher(b, c)
	ctx := context.Background()
	if err := pub.Ping(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < len(msgs); i += 100 {
		if err := pub.Publish(ctx, msgs[i:i+100]); err != nil {
			b.Fatal(err)
		}
	}
	benchReport(b, benchEvents, time.Since(start))
}

func benchRelay(b *testing.B) {
	c := newCluster(b, benchPartitions, benchTopic)
	pg := testdb.NewPostgres(b, testdb.Options{MaxConns: 20})
	ctx := context.Background()
	rows := make([]driver.OutboxRow, 0, 1000)
	for i, m := range benchMessages(b, benchEvents) {
		ev, err := idem.Decode(m)
		if err != nil {
			b.Fatal(err)
		}
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
	pub := newPublisher(b, c)
	if err := pub.Ping(ctx); err != nil {
		b.Fatal(err)
	}
	r, err := relay.New[pgx.Tx](pg.Driver, pub, relay.Config{StatsInterval: -1, Retention: -1, Logger: brokertest.Logger()})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		b.Fatal(err)
	}
	tick := time.NewTicker(2 * time.Millisecond)
	for r.Stats().Published < benchEvents {
		<-tick.C
	}
	tick.Stop()
	benchReport(b, benchEvents, time.Since(start))
	_ = r.Stop(ctx)
}

func benchConsume(b *testing.B) {
	c := newCluster(b, benchPartitions, benchTopic)
	pg := testdb.NewPostgres(b, testdb.Options{MaxConns: 20})
	rawProduce(b, c.ListenAddrs(), benchMessages(b, benchEvents))
	cons, err := inbox.New[pgx.Tx](pg.Driver, inbox.Config{Name: "stock", Logger: brokertest.Logger()})
	if err != nil {
		b.Fatal(err)
	}
	cons.Handle("order.order.placed.v1", func(context.Context, pgx.Tx, idem.Event) error { return nil })
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		ClientConfig: kafka.ClientConfig{Brokers: c.ListenAddrs(), Logger: brokertest.Logger()},
		Group:        "stock",
		Topics:       []string{benchTopic},
	}, cons.DeliverBatch)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	if err := sub.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	tick := time.NewTicker(2 * time.Millisecond)
	for cons.Stats().Applied < benchEvents {
		<-tick.C
	}
	tick.Stop()
	benchReport(b, benchEvents, time.Since(start))
	if err := sub.Stop(context.Background()); err != nil {
		b.Fatal(err)
	}
}
