package amqp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// startRelay runs a relay on pg's outbox publishing through pub.
func startRelay(t *testing.T, pg *testdb.PG, pub *amqp.Publisher) *relay.Relay[pgx.Tx] {
	t.Helper()
	r, err := relay.New[pgx.Tx](pg.Driver, pub, relay.Config{
		PollInterval:    100 * time.Millisecond,
		RetryBackoff:    100 * time.Millisecond,
		MaxRetryBackoff: time.Second,
		StatsInterval:   -1,
		Retention:       -1,
		Logger:          quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("relay Stop: %v", err)
		}
	})
	return r
}

// writeOutbox writes n order events in transactions of up to 500, as the
// order service would.
func writeOutbox(t *testing.T, pg *testdb.PG, n int) []idem.Event {
	t.Helper()
	w := outbox.NewWriter[pgx.Tx](pg.Driver)
	var all []idem.Event
	for start := 0; start < n; start += 500 {
		var evs []idem.Event
		for i := start; i < min(n, start+500); i++ {
			ev, err := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i%100), map[string]int{"order": i})
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		ctx := context.Background()
		tx, err := pg.Driver.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Add(ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	return all
}

// TestEndToEndThroughRelay: outbox write, relay, exchange, queue, consumer
// effect, once.
func TestEndToEndThroughRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.declareQueue(t)
	c := b.consumer(t, nil)
	b.subscribe(t, c.DeliverBatch)
	startRelay(t, b.pg, b.pub)
	evs := writeOutbox(t, b.pg, 3)
	testsvc.WaitFor(t, 30*time.Second, "three events applied", func() bool { return c.Stats().Applied == 3 })
	for _, ev := range evs {
		if n := b.pg.Count(t, "effect WHERE event_id = $1", ev.ID); n != 1 {
			t.Errorf("effects of %s: %d, want 1", ev.ID, n)
		}
	}
	// The relay marks the rows after the broker's confirms: the consumer may
	// apply the events first.
	testsvc.WaitFor(t, 30*time.Second, "every outbox row marked published", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
}

// TestBrokerRestartDuringRun restarts RabbitMQ in the middle of a 10,000
// event run through the relay: every event is applied exactly once.
func TestBrokerRestartDuringRun(t *testing.T) {
	b := newBundle(t, testamqp.Exclusive(t))
	b.declareQueue(t)
	c := b.consumer(t, nil)
	b.subscribe(t, c.DeliverBatch, func(cfg *amqp.SubscriberConfig) { cfg.Logger = quiet })
	const n = 10000
	writeOutbox(t, b.pg, n)
	r := startRelay(t, b.pg, b.pub)
	testsvc.WaitFor(t, 60*time.Second, "a first part applied", func() bool { return c.Stats().Applied >= 1500 })
	testamqp.Restart(t)
	applied := c.Stats().Applied
	if applied >= n {
		t.Fatalf("all %d events applied before the restart finished; the test proves nothing", n)
	}
	testsvc.WaitFor(t, 3*time.Minute, "every event applied", func() bool {
		return b.pg.Count(t, "processed_event WHERE consumer_name = 'stock'") == n
	})
	if got := b.pg.Count(t, "effect"); got != n {
		t.Fatalf("effect rows: %d, want %d", got, n)
	}
	if got := b.pg.Count(t, "(SELECT DISTINCT event_id FROM effect) d"); got != n {
		t.Fatalf("distinct events with an effect: %d, want %d", got, n)
	}
	testsvc.WaitFor(t, 30*time.Second, "outbox fully published", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	s := c.Stats()
	t.Logf("restart at %d applied; relay %+v; consumer applied %d, duplicates %d", applied, r.Stats().Published, s.Applied, s.Duplicates)
}
