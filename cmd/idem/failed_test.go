package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/webhookin"
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
	stored, err := c.Failures().List(context.Background(), idemmsg.FailedFilter{Consumer: "stock"})
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
	stored, err = c.Failures().List(context.Background(), idemmsg.FailedFilter{Consumer: "stock"})
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
		{[]string{"failed"}, "want one of list, groups, show, edit, retry, archive, remove"},
		{[]string{"failed", "show"}, "show takes one message ID"},
		{[]string{"failed", "retry"}, "needs message IDs"},
		{[]string{"failed", "remove", "1", "--all"}, "not both"},
		{[]string{"failed", "show", "x"}, `message ID "x"`},
		{[]string{"failed", "list", "--since", "yesterday"}, "--since"},
		{[]string{"failed", "edit", "1"}, "edit needs --body-file"},
		{[]string{"failed", "retry", "1", "--body-file", "x"}, "go with edit"},
		{[]string{"failed", "retry", "--all", "--to-consumer", "billing"}, "--to-consumer takes message IDs"},
		{[]string{"failed", "archive", "1", "--to-consumer", "billing"}, "--to-consumer goes with retry"},
		{[]string{"failed", "retry", "1", "--archived"}, "--archived goes with"},
		{[]string{"failed", "edit", "1", "--header", "novalue"}, "NAME=VALUE"},
		{[]string{"failed", "--relay", "list", "--archived"}, "not --relay"},
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

// TestFailedRetryAll parks 250 messages of 25 aggregates, more than a page,
// lists them all, then retries them all with --all: every one is applied
// once, each aggregate's events in order (retry goes oldest first and the
// subscriber has one worker), and the store is empty. remove --all goes
// through more than a page too.
func TestFailedRetryAll(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	pg := testdb.NewPostgres(t)
	exchange := testamqp.Name("idem_t_")
	queue := exchange + ".stock"
	pg.Exec(t, `CREATE TABLE reservation (event_id uuid PRIMARY KEY, order_id text NOT NULL, version bigint NOT NULL)`)

	c, err := inbox.New[pgx.Tx](pg.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu         sync.Mutex
		outOfOrder []string
		last       = map[string]int64{}
	)
	c.Handle("order.order.changed.v1", func(ctx context.Context, tx pgx.Tx, ev idemmsg.Event) error {
		mu.Lock()
		if ev.AggregateVersion <= last[ev.AggregateID] {
			outOfOrder = append(outOfOrder, fmt.Sprintf("%s v%d after v%d", ev.AggregateID, ev.AggregateVersion, last[ev.AggregateID]))
		}
		last[ev.AggregateID] = ev.AggregateVersion
		mu.Unlock()
		_, err := tx.Exec(ctx, `INSERT INTO reservation VALUES ($1, $2, $3)`, ev.ID, ev.AggregateID, ev.AggregateVersion)
		return err
	})
	sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: url},
		Exchange:   exchange,
		Queue:      queue,
		Bindings:   []string{"order.#"},
		Workers:    1,
	}, c.DeliverBatch)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Stop(context.Background()) })

	// Parked in the order the events happened: version 1 of every
	// aggregate, then version 2...
	const aggregates, versions = 25, 10
	store := c.Failures()
	ctx := context.Background()
	for v := 1; v <= versions; v++ {
		for a := range aggregates {
			ev, err := idemmsg.NewEvent("order.order.changed.v1", "order", fmt.Sprint("o", a), map[string]int{"v": v})
			if err != nil {
				t.Fatal(err)
			}
			ev.AggregateVersion = int64(v)
			msg, err := idemmsg.NewMessage(ev)
			if err != nil {
				t.Fatal(err)
			}
			_, err = store.Save(ctx, idemmsg.FailedMessage{
				Consumer: "stock", Source: queue, EventID: ev.ID, EventName: ev.Name, AggregateType: "order", AggregateID: ev.AggregateID,
				Key: msg.Key, Headers: msg.Headers, Body: msg.Body, Error: "warehouse table locked", Attempts: 3,
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	const total = aggregates * versions
	env := map[string]string{"IDEM_DB_URL": pg.URL, "IDEM_BROKER_URL": url}

	code, out, errOut := idem(t, env, "", "failed", "list", "--consumer", "stock", "--limit", "0")
	if lines := strings.Count(out, "\n"); code != 0 || lines != total+1 {
		t.Fatalf("failed list --limit 0 = %d, %d lines (want a header and %d messages)\n%s", code, lines, total, errOut)
	}
	code, out, _ = idem(t, env, "", "failed", "list", "--consumer", "stock")
	if lines := strings.Count(out, "\n"); code != 0 || lines != 101 {
		t.Fatalf("failed list = %d, %d lines; want the default 100 messages", code, lines)
	}

	// Its output is no terminal: progress lines in the log, at each
	// message with the shortest interval, and a summary.
	env[progressIntervalEnv] = "1ns"
	code, out, errOut = idem(t, env, "", "failed", "retry", "--all", "--consumer", "stock")
	delete(env, progressIntervalEnv)
	if code != 0 || strings.Count(out, "Retried ") != total+1 || !strings.Contains(out, fmt.Sprintf("Retried %d failed message(s).", total)) {
		t.Fatalf("failed retry --all = %d\n%s%s", code, lastLines(out, 5), errOut)
	}
	if !strings.Contains(errOut, `msg="failed retry progress" messages=`) ||
		!strings.Contains(errOut, fmt.Sprintf(`msg="failed retry done" messages=%d total=%[1]d percent=100 `, total)) || !strings.Contains(errOut, "not_retried=0") {
		t.Errorf("failed retry --all logged no progress line or no summary:\n%s", lastLines(errOut, 3))
	}
	waitFor(t, "every retried message applied", func() bool { return c.Stats().Applied == total })
	if n := pg.Count(t, "reservation"); n != total {
		t.Fatalf("reservations = %d, want %d", n, total)
	}
	if n := pg.Count(t, "failed_message"); n != 0 {
		t.Fatalf("failed_message rows after retry --all = %d, want 0", n)
	}
	mu.Lock()
	if len(outOfOrder) > 0 {
		t.Errorf("events of an aggregate applied out of order: %v", outOfOrder)
	}
	mu.Unlock()

	// remove --all, over more than a page, after confirmation.
	for i := range 150 {
		if _, err := store.Save(ctx, idemmsg.FailedMessage{Consumer: "billing", Body: []byte(fmt.Sprint("garbage ", i)), Error: "undecodable", Attempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	code, _, errOut = idem(t, env, "n\n", "failed", "remove", "--all", "--consumer", "billing")
	if code != 1 || !strings.Contains(errOut, "more than 99") || pg.Count(t, "failed_message") != 150 {
		t.Fatalf("failed remove --all answered no = %d %q", code, errOut)
	}
	code, out, errOut = idem(t, env, "y\n", "failed", "remove", "--all", "--consumer", "billing")
	if code != 0 || !strings.Contains(out, "Removed 150 failed message(s).") {
		t.Fatalf("failed remove --all = %d\n%s%s", code, lastLines(out, 5), errOut)
	}
	if n := pg.Count(t, "failed_message"); n != 0 {
		t.Fatalf("failed_message rows after remove --all = %d", n)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n") + "\n"
}

// TestFailedRetryHeld retries a parked message: it goes back to its queue
// marked with its failure-store id, then the message held behind it, in
// that order (inbox.FailureStore.Retry, which the dashboard uses too).
func TestFailedRetryHeld(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	pg := testdb.NewPostgres(t)
	queue := testamqp.Name("idem_t_held_")
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	store := inbox.NewFailureStore(pg.Driver)
	ctx := context.Background()
	save := func(body string, heldBy int64) int64 {
		ev := idemmsg.NewEventID()
		id, err := store.Save(ctx, idemmsg.FailedMessage{Consumer: "stock", Source: queue, EventID: ev, EventName: "order.order.placed.v1",
			AggregateType: "order", AggregateID: "42", HeldBy: heldBy, Body: []byte(body), Error: "boom", Attempts: 1,
			Headers: map[string]string{"x-trace": body}})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	first := save("first", 0)
	held := save("held", first)
	code, out, errOut := idem(t, map[string]string{"IDEM_DB_URL": pg.URL, "IDEM_BROKER_URL": url}, "", "failed", "retry", strconv.FormatInt(first, 10))
	if code != 0 || strings.Count(out, "Retried ") != 2 {
		t.Fatalf("failed retry = %d\n%s%s", code, out, errOut)
	}
	for _, want := range []struct {
		id   int64
		body string
	}{{first, "first"}, {held, "held"}} {
		var d amqp091.Delivery
		waitFor(t, "a re-driven message in the queue", func() bool {
			var ok bool
			d, ok, err = ch.Get(queue, true)
			return err == nil && ok
		})
		if string(d.Body) != want.body || d.Headers[idemmsg.HeaderRedrive] != strconv.FormatInt(want.id, 10) || d.Headers["x-trace"] != want.body {
			t.Errorf("re-driven %q with headers %v; want %q with %s=%d", d.Body, d.Headers, want.body, idemmsg.HeaderRedrive, want.id)
		}
	}
	// The entries stay until the consumer applies the messages.
	if n := pg.Count(t, "failed_message"); n != 2 {
		t.Errorf("%d entries after the retry, want 2", n)
	}
}

// TestFailedRetryWebhook: a message a webhook handler parked is not sent to
// a broker queue named after its source: retry says where to re-drive it,
// and needs no broker for it; list and show work on it.
func TestFailedRetryWebhook(t *testing.T) {
	t.Parallel()
	s := testdb.NewSQLite(t)
	store := inbox.NewFailureStore(s.Driver)
	id, err := store.Save(context.Background(), idemmsg.FailedMessage{Consumer: "payments", Source: webhookin.SourcePrefix + "payments",
		Headers: map[string]string{"webhook-id": "msg_1"}, Body: []byte(`{"type":"invoice.paid"}`),
		Error: "idem: undecodable message: body is not JSON", Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"IDEM_DB_URL": "sqlite:" + s.URL}
	code, out, errOut := idem(t, env, "", "failed", "show", strconv.FormatInt(id, 10))
	if code != 0 || !strings.Contains(out, "webhook:payments") || !strings.Contains(out, "invoice.paid") {
		t.Fatalf("failed show = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = idem(t, env, "", "failed", "retry", strconv.FormatInt(id, 10))
	if code == 0 || !strings.Contains(errOut, "webhook handler") || !strings.Contains(errOut, "inbox.FailureStore.Retry") {
		t.Fatalf("failed retry = %d\n%s%s; want a refusal saying where to re-drive it", code, out, errOut)
	}
	if m, err := store.Get(context.Background(), id); err != nil || m.Attempts != 1 {
		t.Errorf("the entry after the refusal: %+v, %v; want it as it was", m, err)
	}
}
