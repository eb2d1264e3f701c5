package main

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
)

// TestFailedCommands parks a message whose handler always fails, then lists,
// shows and retries it with the handler fixed: it is applied once. A
// malformed message is removed after confirmation.
func TestFailedCommands(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	pg := testdb.NewPostgres(t)
	exchange := testamqp.Name("idem_t_")
	queue := exchange + ".stock"
	pg.Exec(t, `CREATE TABLE reservation (event_id uuid NOT NULL)`)

	var broken atomic.Bool
	broken.Store(true)
	c, err := inbox.New[pgx.Tx](pg.Driver, inbox.Config{Name: "stock", Retry: inbox.RetryPolicy{MaxRetries: 1, InitialDelay: 10 * time.Millisecond, Jitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idemmsg.Event) error {
		if broken.Load() {
			return errors.New("warehouse table locked")
		}
		_, err := tx.Exec(ctx, `INSERT INTO reservation VALUES ($1)`, ev.ID)
		return err
	})
	sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: url},
		Exchange:   exchange,
		Queue:      queue,
		Bindings:   []string{"order.#"},
	}, c.DeliverBatch)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Stop(context.Background()) })

	ev, err := idemmsg.NewEvent("order.order.placed.v1", "order", "42", map[string]int{"lines": 2})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := idemmsg.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(context.Background(), []idemmsg.Message{msg}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message parked", func() bool { return c.Stats().Parked == 1 })

	env := map[string]string{"IDEM_DB_URL": pg.URL, "IDEM_BROKER_URL": url}
	code, out, errOut := idem(t, env, "", "failed", "list", "--consumer", "stock", "--since", "1h")
	if code != 0 || !strings.Contains(out, ev.ID.String()) || !strings.Contains(out, "idem: handling order.order.placed.v1") {
		t.Fatalf("failed list = %d\n%s%s", code, out, errOut)
	}
	code, out, _ = idem(t, env, "", "failed", "list", "--event", "other.event.v1")
	if code != 0 || !strings.Contains(out, "No failed message") {
		t.Fatalf("failed list with another event = %d\n%s", code, out)
	}
	stored, err := c.Failures().List(context.Background(), driver.FailedFilter{Consumer: "stock"})
	if err != nil || len(stored) != 1 {
		t.Fatalf("stored: %v %v", stored, err)
	}
	id := strconv.FormatInt(stored[0].ID, 10)
	code, out, errOut = idem(t, env, "", "failed", "show", id)
	if code != 0 || !strings.Contains(out, string(msg.Body)) || !strings.Contains(out, "Attempts:      2") ||
		!strings.Contains(out, "Source:        "+queue) || !strings.Contains(out, "History:") {
		t.Fatalf("failed show = %d\n%s%s", code, out, errOut)
	}

	broken.Store(false)
	code, out, errOut = idem(t, env, "", "failed", "retry", id)
	if code != 0 || !strings.Contains(out, "Retried "+id) {
		t.Fatalf("failed retry = %d\n%s%s", code, out, errOut)
	}
	waitFor(t, "the retried message applied", func() bool { return c.Stats().Applied == 1 })
	if n := pg.Count(t, "reservation WHERE event_id = $1", ev.ID); n != 1 {
		t.Fatalf("reservations: %d, want 1", n)
	}
	if n := pg.Count(t, "failed_message"); n != 0 {
		t.Fatalf("failed_message rows after retry: %d, want 0", n)
	}

	// A malformed message: parked at once, then removed.
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(context.Background(), exchange, "order.order.placed.v1", false, false, amqp091.Publishing{Body: []byte("garbage")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the malformed message parked", func() bool { return c.Stats().Parked == 2 })
	stored, err = c.Failures().List(context.Background(), driver.FailedFilter{Consumer: "stock"})
	if err != nil || len(stored) != 1 {
		t.Fatalf("stored: %v %v", stored, err)
	}
	id = strconv.FormatInt(stored[0].ID, 10)
	code, _, errOut = idem(t, env, "n\n", "failed", "remove", id)
	if code != 1 || !strings.Contains(errOut, "not confirmed") {
		t.Fatalf("failed remove answered no = %d %s", code, errOut)
	}
	code, out, errOut = idem(t, env, "", "failed", "remove", id, "--yes")
	if code != 0 || !strings.Contains(out, "Removed "+id) {
		t.Fatalf("failed remove --yes = %d\n%s%s", code, out, errOut)
	}
	if n := pg.Count(t, "failed_message"); n != 0 {
		t.Fatalf("failed_message rows after remove: %d", n)
	}
}

func TestFailedUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"failed"}, "want one of list, show, retry, remove"},
		{[]string{"failed", "show"}, "show takes one message ID"},
		{[]string{"failed", "retry"}, "needs message IDs"},
		{[]string{"failed", "remove", "1", "--all"}, "not both"},
		{[]string{"failed", "show", "x"}, `message ID "x"`},
		{[]string{"failed", "list", "--since", "yesterday"}, "--since"},
	} {
		code, _, errOut := idem(t, nil, "", tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v = %d %q, want usage error containing %q", tc.args, code, errOut, tc.want)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}
