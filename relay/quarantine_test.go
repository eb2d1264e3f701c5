package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// rabbit is a RabbitMQ exchange with one queue, read with basic.get.
type rabbit struct {
	url, exchange, queue string
	conn                 *amqp091.Connection
	ch                   *amqp091.Channel
	got                  []idem.Event
	seen                 map[uuid.UUID]bool
}

// newRabbit declares a fresh exchange and a queue bound to keys.
func newRabbit(t *testing.T, url string, keys ...string) *rabbit {
	t.Helper()
	q := &rabbit{url: url, exchange: testamqp.Name("idem_t_"), seen: map[uuid.UUID]bool{}}
	q.queue = q.exchange + ".events"
	q.connect(t)
	if err := q.ch.ExchangeDeclare(q.exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := q.ch.QueueDeclare(q.queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		q.bind(t, k)
	}
	t.Cleanup(func() {
		if q.conn == nil || q.conn.IsClosed() {
			q.connect(t)
		}
		_, _ = q.ch.QueueDelete(q.queue, false, false, false)
		_ = q.ch.ExchangeDelete(q.exchange, false, false)
		_ = q.conn.Close()
	})
	return q
}

func (q *rabbit) connect(t *testing.T) {
	t.Helper()
	conn, err := amqp091.Dial(q.url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		t.Fatal(err)
	}
	q.conn, q.ch = conn, ch
}

func (q *rabbit) bind(t *testing.T, key string) {
	t.Helper()
	if err := q.ch.QueueBind(q.queue, key, q.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
}

// publisher returns an idem publisher on the exchange.
func (q *rabbit) publisher(t *testing.T) *amqp.Publisher {
	t.Helper()
	pub, err := amqp.NewPublisher(amqp.PublisherConfig{
		ConnConfig: amqp.ConnConfig{URL: q.url, ReconnectMax: 500 * time.Millisecond, Logger: testLogger(t)},
		Exchange:   q.exchange,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// waitLen reads the queue until it has delivered n distinct events in all,
// and returns every delivery so far.
func (q *rabbit) waitLen(t *testing.T, n int) []idem.Event {
	t.Helper()
	testsvc.WaitFor(t, time.Minute, fmt.Sprintf("%d events in the queue", n), func() bool {
		for len(q.seen) < n {
			d, ok, err := q.ch.Get(q.queue, true)
			if err != nil {
				t.Fatalf("basic.get: %v", err)
			}
			if !ok {
				return false
			}
			id, _ := uuid.Parse(d.MessageId)
			ev := decode(t, idem.Message{EventID: id, EventName: d.Type, Body: d.Body})
			q.got = append(q.got, ev)
			q.seen[ev.ID] = true
		}
		return true
	})
	return q.got
}

// eventIDs returns the ids of the events of aggregate among evs, in order
// of first delivery.
func eventIDs(evs []idem.Event, aggregate string) []uuid.UUID {
	var out []uuid.UUID
	seen := map[uuid.UUID]bool{}
	for _, ev := range evs {
		if ev.AggregateID == aggregate && !seen[ev.ID] {
			seen[ev.ID] = true
			out = append(out, ev.ID)
		}
	}
	return out
}

func checkEventOrder(t *testing.T, evs []idem.Event) {
	t.Helper()
	last := map[string]int64{}
	seen := map[uuid.UUID]bool{}
	for _, ev := range evs {
		if seen[ev.ID] {
			continue
		}
		seen[ev.ID] = true
		if ev.AggregateVersion < last[ev.AggregateID] {
			t.Fatalf("aggregate %s: version %d published after %d", ev.AggregateID, ev.AggregateVersion, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.AggregateVersion
	}
}

// TestQuarantineUnroutableOnRabbitMQ: an event whose routing key no queue
// is bound to is returned by RabbitMQ as unroutable on each attempt, and
// quarantined after Config.QuarantineAfter of them while the other
// aggregates flow; the later event of its aggregate waits. Once a binding
// exists, re-driving it publishes it, then the event behind it, in order.
func TestQuarantineUnroutableOnRabbitMQ(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := newRabbit(t, testamqp.URL(t), "order.order.changed.v1")
	shipped, err := idem.NewEvent("order.order.shipped.v1", "order", "bad", map[string]int{"parcel": 1})
	if err != nil {
		t.Fatal(err)
	}
	shipped.AggregateVersion = 1
	behind := event(t, "bad", 2)
	b.insert(t, shipped, behind)
	var good []idem.Event
	for a := range 20 {
		good = append(good, event(t, fmt.Sprint(a), 1), event(t, fmt.Sprint(a), 2))
	}
	b.insert(t, good...)

	cfg := fastConfig(t)
	cfg.QuarantineAfter = 3
	cfg.StatsInterval = 20 * time.Millisecond
	r, err := relay.New(b.pg.Driver, q.publisher(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })

	got := q.waitLen(t, len(good))
	testsvc.WaitFor(t, 30*time.Second, "the unroutable event quarantined", func() bool {
		s := r.Stats()
		return s.Quarantined == 1 && s.QuarantinedRows == 1
	})
	if n := b.pg.Count(t, `outbox WHERE id = $1 AND quarantined_at IS NOT NULL AND attempts = 3
		AND last_error LIKE '%refused by the broker on 3 attempts%' AND last_error LIKE '%unroutable%'`, shipped.ID); n != 1 {
		t.Fatalf("the unroutable event is not quarantined after 3 attempts with its error")
	}
	if n := b.pg.Count(t, "outbox WHERE id = $1 AND published_at IS NULL AND quarantined_at IS NULL", behind.ID); n != 1 {
		t.Fatalf("the event behind the quarantined one is not waiting")
	}
	checkEventOrder(t, got)
	if ids := eventIDs(got, "bad"); len(ids) != 0 {
		t.Fatalf("published %v of the quarantined aggregate", ids)
	}

	q.bind(t, "order.order.shipped.v1")
	d := b.pg.Driver.Dialect()
	var seq int64
	if err := b.pg.Pool.QueryRow(context.Background(), `SELECT seq FROM outbox WHERE id = $1`, shipped.ID).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	if n, err := d.RequeueQuarantined(context.Background(), b.pg.Driver.Pool(), []int64{seq}); err != nil || n != 1 {
		t.Fatalf("requeue = %d, %v", n, err)
	}
	got = q.waitLen(t, len(good)+2)
	if ids := eventIDs(got, "bad"); !slices.Equal(ids, []uuid.UUID{shipped.ID, behind.ID}) {
		t.Fatalf("aggregate bad published %v, want the re-driven event, then the one behind it", ids)
	}
	testsvc.WaitFor(t, 10*time.Second, "everything marked", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
}

// TestQuarantineNothingWhileRabbitMQIsDown stops RabbitMQ for many more
// attempts than Config.QuarantineAfter: no row is quarantined or charged an
// attempt, and everything is published, in order, once it is back.
func TestQuarantineNothingWhileRabbitMQIsDown(t *testing.T) {
	url := testamqp.Exclusive(t)
	b := setup(t)
	q := newRabbit(t, url, "#")
	cfg := fastConfig(t)
	cfg.QuarantineAfter = 2
	cfg.RetryBackoff = 50 * time.Millisecond
	cfg.MaxRetryBackoff = 200 * time.Millisecond
	cfg.PublishTimeout = time.Second
	r, err := relay.New(b.pg.Driver, q.publisher(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })

	var evs []idem.Event
	for a := range 5 {
		evs = append(evs, event(t, fmt.Sprint(a), 1))
	}
	b.insert(t, evs...)
	q.waitLen(t, len(evs))

	testamqp.Stop(t)
	before := r.Stats().PublishErrors
	// Three more events of the five aggregates published, three of five
	// new ones.
	for a := range 10 {
		first := 2
		if a >= 5 {
			first = 1
		}
		for v := first; v < first+3; v++ {
			evs = append(evs, event(t, fmt.Sprint(a), v))
		}
	}
	b.insert(t, evs[5:]...)
	// Ten failed calls at least, each failing the heads of ten aggregates.
	testsvc.WaitFor(t, 2*time.Minute, "failed attempts while RabbitMQ is down", func() bool {
		return r.Stats().PublishErrors-before >= 100
	})
	if n := b.pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL OR attempts > 0"); n != 0 {
		t.Fatalf("%d rows quarantined or charged an attempt while RabbitMQ was down", n)
	}
	testamqp.Start(t)
	q.connect(t)
	got := q.waitLen(t, len(evs))
	checkEventOrder(t, got)
	testsvc.WaitFor(t, 30*time.Second, "everything marked", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	if s := r.Stats(); s.Quarantined != 0 {
		t.Errorf("Stats().Quarantined = %d, want 0", s.Quarantined)
	}
	if n := b.pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL OR attempts > 0"); n != 0 {
		t.Errorf("%d rows quarantined or charged an attempt", n)
	}
}

// TestQuarantineIsLogged: each quarantine is logged at error level with the
// row's seq, id, aggregate and error.
func TestQuarantineIsLogged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := event(t, "bad", 1)
	b.pub.SetFunc(func(int, []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			if m.EventID == bad.ID {
				return errors.New("message too large")
			}
			return nil
		}}
	})
	b.insert(t, bad, event(t, "good", 1))
	var logs syncBuffer
	cfg := fastConfig(t)
	cfg.QuarantineAfter = 1
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	r := b.start(t, cfg)
	testsvc.WaitFor(t, 10*time.Second, "the refused row quarantined", func() bool { return r.Stats().Quarantined == 1 })
	var seq int64
	if err := b.pg.Pool.QueryRow(context.Background(), `SELECT seq FROM outbox WHERE id = $1`, bad.ID).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["level"] != "ERROR" || !strings.Contains(fmt.Sprint(rec["msg"]), "quarantined") {
			continue
		}
		found = true
		if rec["seq"] != float64(seq) || rec["id"] != bad.ID.String() || rec["aggregate_type"] != "order" ||
			rec["aggregate_id"] != "bad" || !strings.Contains(fmt.Sprint(rec["error"]), "message too large") {
			t.Errorf("quarantine logged as %s", line)
		}
	}
	if !found {
		t.Fatalf("no quarantine logged at error level:\n%s", logs.String())
	}
}

// TestQuarantineNotice: with Config.OnQuarantine set to
// outbox.FailureEvents, each row the relay quarantines (refused by the
// broker, or unreadable) writes its notice into the outbox in the
// quarantine's transaction, and the relay publishes it: name, table, seq,
// class, group, error, event and aggregate, no payload. A hook that fails
// rolls the quarantine back: the row stays unquarantined, tried again.
func TestQuarantineNotice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := event(t, "bad", 1)
	b.pub.SetFunc(func(int, []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			if m.EventID == bad.ID {
				return errors.New("message too large")
			}
			return nil
		}}
	})
	b.insert(t, bad)
	b.pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers) VALUES ($1, 'order', 'odd', 'order.changed.v1', '{}', '[1]')`, uuid.New())

	// A hook that fails: nothing is quarantined, the rows are tried again.
	failing := errors.New("the notice table is away")
	var calls atomic.Int64
	cfg := fastConfig(t)
	cfg.QuarantineAfter = 1
	cfg.OnQuarantine = func(context.Context, driver.Executor, idem.FailureNotice) error { calls.Add(1); return failing }
	r := b.start(t, cfg)
	testsvc.WaitFor(t, 30*time.Second, "the hook called", func() bool { return calls.Load() >= 2 })
	if err := r.Stop(testsvc.Ctx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := b.pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows quarantined though the hook failed", n)
	}

	cfg.OnQuarantine = outbox.FailureEvents(outbox.NewWriter(b.pg.Driver), outbox.FailureEventsConfig{})
	b.start(t, cfg)
	if err := b.pub.WaitLen(testsvc.Ctx(t, 30*time.Second), 2); err != nil {
		t.Fatal(err)
	}
	notices := map[string]idem.FailureNotice{}
	for _, m := range b.pub.Messages() {
		if m.EventName != idem.FailureRowQuarantined {
			t.Errorf("published %s (%s), want only notices", m.EventName, m.EventID)
			continue
		}
		ev := decode(t, m)
		var n idem.FailureNotice
		if err := json.Unmarshal(ev.Payload, &n); err != nil {
			t.Fatal(err)
		}
		if ev.AggregateType != outbox.QuarantinedRowAggregate || ev.AggregateID != fmt.Sprintf("outbox:%d", n.OutboxSeq) {
			t.Errorf("notice of aggregate %s %s", ev.AggregateType, ev.AggregateID)
		}
		notices[n.AggregateID] = n
	}
	refused, odd := notices["bad"], notices["odd"]
	var seq int64
	if err := b.pg.Pool.QueryRow(context.Background(), `SELECT seq FROM outbox WHERE id = $1`, bad.ID).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	if refused.OutboxTable != "outbox" || refused.OutboxSeq != seq || refused.Class != "refused" || refused.EventID != bad.ID ||
		refused.EventName != bad.Name || !strings.Contains(refused.Error, "message too large") || len(refused.Group) != 12 || refused.Body != nil {
		t.Errorf("refused row's notice = %+v", refused)
	}
	if odd.Class != "unreadable" || odd.OutboxSeq == 0 || odd.OutboxSeq == seq || odd.AggregateType != "order" {
		t.Errorf("unreadable row's notice = %+v", odd)
	}
	if n := b.pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL"); n != 2 {
		t.Errorf("%d rows quarantined, want 2", n)
	}
}
