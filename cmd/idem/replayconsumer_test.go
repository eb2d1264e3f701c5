package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testkafka"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
)

// TestReplayToConsumer: "idem replay --to-consumer A" puts the published
// events of the period in A's queue only, each aggregate's in order; B's
// queue, bound to the same events, gets none.
func TestReplayToConsumer(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	pg := testdb.NewPostgres(t)
	exchange := testamqp.Name("idem_t_")
	a, b := exchange+"-a", exchange+"-b"
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{a, b} {
		q := amqp.QueueName(c)
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "order.#", exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	}

	var evs []idemmsg.Event
	for i := range 12 {
		ev, err := idemmsg.NewEvent("order.order.changed.v1", "order", fmt.Sprint(i%3), map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	ctx := context.Background()
	w := outbox.NewWriter(pg.Driver)
	if err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error { return w.Add(ctx, tx, evs...) }); err != nil {
		t.Fatal(err)
	}
	pg.Exec(t, `UPDATE outbox SET published_at = now()`)

	// The exchange both queues are bound to: a replay to every consumer
	// would fill both.
	env := map[string]string{"IDEM_DB_URL": pg.URL, "IDEM_BROKER_URL": url + "?exchange=" + exchange}
	code, out, errOut := idem(t, env, "", "replay", "--since", "1h", "--to-consumer", a, "--yes", "--batch-size", "5")
	if code != 0 || !strings.Contains(out, "Replayed 12 events") {
		t.Fatalf("replay --to-consumer = %d:\n%s%s", code, out, errOut)
	}
	drain := func(consumer string) []string {
		t.Helper()
		var ids []string
		for {
			m, ok, err := ch.Get(amqp.QueueName(consumer), true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return ids
			}
			ids = append(ids, m.MessageId)
		}
	}
	got := drain(a)
	if len(got) != len(evs) {
		t.Fatalf("%s's queue holds %d messages, want the %d replayed", a, len(got), len(evs))
	}
	for agg := range 3 {
		var want, order []string
		for i, ev := range evs {
			if i%3 == agg {
				want = append(want, ev.ID.String())
			}
		}
		for _, id := range got {
			if slices.Contains(want, id) {
				order = append(order, id)
			}
		}
		if !slices.Equal(order, want) {
			t.Errorf("aggregate %d replayed in the order %v, want %v", agg, order, want)
		}
	}
	if n := len(drain(b)); n != 0 {
		t.Errorf("%s's queue holds %d messages replayed to %s only", b, n, a)
	}

	code, _, errOut = idem(t, env, "", "replay", "--since", "1h", "--prefix", "x")
	if code != 2 || !strings.Contains(errOut, "--prefix goes with --to-consumer") {
		t.Errorf("replay --prefix without --to-consumer = %d %s", code, errOut)
	}
}

// TestReplayToConsumerKafka: on Kafka, "idem replay --to-consumer C"
// rewinds C's group to --since: refused while C's subscriber runs, and
// with --until; done once it is stopped, after which a new subscriber reads
// the records again.
func TestReplayToConsumerKafka(t *testing.T) {
	t.Parallel()
	url := testkafka.Start(t) + "?session_timeout=6s"
	ctx := testsvc.Ctx(t, time.Minute)
	pub, err := registry.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var msgs []idemmsg.Message
	for i := range 6 {
		ev, err := idemmsg.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		m, err := idemmsg.NewMessage(ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	since := time.Now().Add(-time.Minute)
	var read atomic.Int64
	subscribe := func() func() {
		sub, err := registry.Subscribe(url, registry.SubscribeConfig{Consumer: "stock", EventNames: []string{"order.order.placed.v1"}},
			func(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
				read.Add(int64(len(ds)))
				disps := make([]broker.Disposition, len(ds))
				for i := range disps {
					disps[i].Action = broker.Ack
				}
				return disps, make([]error, len(ds))
			})
		if err != nil {
			t.Fatal(err)
		}
		return testsvc.Start(t, sub)
	}
	inspector := pub.(broker.Inspector)
	committed := func() bool {
		stats, err := inspector.Inspect(ctx, []string{"stock"})
		return err == nil && len(stats) == 1 && stats[0].Lag == 0
	}
	stop := subscribe() // it creates the topic
	if err := pub.Publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 30*time.Second, "the records read and committed", func() bool { return read.Load() == 6 && committed() })

	env := map[string]string{"IDEM_BROKER_URL": url}
	at := since.UTC().Format(time.RFC3339)
	code, out, errOut := idem(t, env, "", "replay", "--since", at, "--to-consumer", "stock", "--yes")
	if code != 1 || !strings.Contains(errOut, "stop consumer stock's subscribers first") {
		t.Fatalf("replay --to-consumer with the subscriber running = %d:\n%s%s", code, out, errOut)
	}
	stop()
	code, _, errOut = idem(t, env, "", "replay", "--since", at, "--until", "1s", "--to-consumer", "stock", "--yes")
	if code != 2 || !strings.Contains(errOut, "do not go with a rewind") {
		t.Errorf("replay --to-consumer --until on Kafka = %d: %s", code, errOut)
	}
	code, out, errOut = idem(t, env, "", "replay", "--since", at, "--to-consumer", "stock", "--yes")
	if code != 0 || !strings.Contains(out, "Rewound consumer stock's group to "+at) {
		t.Fatalf("replay --to-consumer = %d:\n%s%s", code, out, errOut)
	}
	subscribe()
	testsvc.WaitFor(t, 30*time.Second, "the records read again", func() bool { return read.Load() == 12 && committed() })
}
