package cdc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/cdc"
)

// BenchmarkDrain measures the drain of a backlog written before the relay
// starts (the slot exists): rows and WAL messages to the in-process
// publisher, without the archive and with it (-archive: until every event
// is archived too; the rows until they are deleted too), rows to RabbitMQ
// (until the queue holds them all). b.N events in 1,000 aggregates, 100 per
// transaction.
//
//	IDEM_TEST_SERVERS=postgres make test ARGS='-run XXX -bench Drain -benchtime 20000x ./relay/cdc/'
//
// (make test adds -race; without it: IDEM_TEST_SHELL=1 IDEM_TEST_SERVERS="postgres rabbitmq"
// IDEM_TEST_CMD='go test -tags idemfault -run XXX -bench Drain -benchtime 50000x ./relay/cdc/' bash scripts/test.sh)
func BenchmarkDrain(b *testing.B) {
	for _, name := range []string{"table", "table-archive", "wal", "wal-archive", "table-rabbitmq", "table-rabbitmq-archive"} {
		b.Run(name, func(b *testing.B) {
			pg := newDB(b)
			cfg := fastConfig(nil)
			archive := strings.HasSuffix(name, "-archive")
			mode := strings.TrimSuffix(name, "-archive")
			if !archive {
				cfg.ArchiveRetention = -1
			}
			// The slot first: it reads from its creation on.
			first := start(b, pg, memory.New(), cfg)
			stop(b, first)
			w := outbox.NewWriter(pg.Driver)
			var q *benchRabbit
			if mode == "table-rabbitmq" {
				q = newBenchRabbit(b)
			}
			if mode == "wal" {
				var err error
				if w, err = outbox.NewLogWriter(pg.Driver, pg.Schema); err != nil {
					b.Fatal(err)
				}
			}
			ctx := context.Background()
			for i := 0; i < b.N; i += 100 {
				err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
					var evs []idem.Event
					for j := i; j < min(i+100, b.N); j++ {
						evs = append(evs, event(b, fmt.Sprint(j%1000), j/1000+1))
					}
					return w.Add(ctx, tx, evs...)
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			pub := memory.New()
			b.ResetTimer()
			began := time.Now()
			var r *cdc.Relay
			if q != nil {
				r = start(b, pg, q.pub, cfg)
				q.wait(b, b.N)
			} else {
				r = start(b, pg, pub, cfg)
				ctx2, cancel := context.WithTimeout(ctx, 10*time.Minute)
				defer cancel()
				if err := pub.WaitLen(ctx2, b.N); err != nil {
					b.Fatal(err)
				}
				// The relay's writes after the broker's confirmation.
				for (archive && r.Stats().Archived < int64(b.N)) || (mode == "table" && r.Stats().Deleted < int64(b.N)) {
					if ctx2.Err() != nil {
						b.Fatalf("archived %d, deleted %d of %d", r.Stats().Archived, r.Stats().Deleted, b.N)
					}
					time.Sleep(time.Millisecond)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "events/s")
			if archive {
				// What the archive keeps per event: heap, indexes, TOAST.
				var size int64
				if err := pg.Pool.QueryRow(ctx, `SELECT pg_total_relation_size('outbox_archive')`).Scan(&size); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(size)/float64(b.N), "archive-B/event")
			}
			if s := r.Stats(); s.PublishCalls > 0 {
				b.ReportMetric(float64(s.Published)/float64(s.PublishCalls), "msgs/call")
			}
		})
	}
}

// benchRabbit is a RabbitMQ exchange whose queue's length tells what
// arrived.
type benchRabbit struct {
	pub   *amqp.Publisher
	ch    *amqp091.Channel
	queue string
}

func newBenchRabbit(b *testing.B) *benchRabbit {
	url := testamqp.URL(b)
	exchange := testamqp.Name("idem_b_cdc_")
	conn, err := amqp091.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q := &benchRabbit{ch: ch, queue: exchange + ".events"}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q.queue, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if err := ch.QueueBind(q.queue, "#", exchange, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_, _ = ch.QueueDelete(q.queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	})
	q.pub, err = amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url, Logger: testLogger(nil)}, Exchange: exchange})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = q.pub.Close() })
	return q
}

// wait waits until the queue holds n messages.
func (q *benchRabbit) wait(b *testing.B, n int) {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		st, err := q.ch.QueueDeclarePassive(q.queue, true, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		if st.Messages >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d messages in the queue", st.Messages, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
