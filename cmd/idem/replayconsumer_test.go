package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
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
