package kafka_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// End to end: events written to the outbox in business transactions, moved
// to Kafka by the relay, consumed by four subscribers of one group over
// eight partitions: every event is applied once, each aggregate in order.
func TestRelayEndToEnd(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	c := newCluster(t, 8, topic)
	src := testdb.NewPostgres(t) // the producing service's database
	dst := testdb.NewPostgres(t) // the consuming service's database
	evs := newEvents(t, 2000, 100)

	cons := effectConsumer(t, dst, "e2e", inbox.RetryPolicy{}, nil)
	for range 4 {
		subscribe(t, c, "e2e", []string{topic}, cons.DeliverBatch, func(cfg *kafka.SubscriberConfig) { cfg.BatchSize = 50 })
	}

	r, err := relay.New(src.Driver, newPublisher(t, c), relay.Config{
		Workers:       2,
		PollInterval:  50 * time.Millisecond,
		StatsInterval: -1,
		Logger:        brokertest.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var stopOnce sync.Once
	stopRelay := func() {
		stopOnce.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := r.Stop(ctx); err != nil {
				t.Errorf("relay Stop: %v", err)
			}
		})
	}
	t.Cleanup(stopRelay)

	// Business transactions, a few events each, in order per aggregate.
	w := outbox.NewWriter[pgx.Tx](src.Driver)
	ctx := context.Background()
	for i := 0; i < len(evs); i += 20 {
		tx, err := src.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Add(ctx, tx, evs[i:i+20]...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	testsvc.WaitFor(t, 90*time.Second, "every event applied", func() bool {
		return dst.Count(t, "effect") >= len(evs)
	})
	stopRelay()
	checkOnceInOrder(t, dst, "e2e", evs)
}
