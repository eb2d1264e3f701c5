package inbox_test

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// effectConsumer returns a consumer whose handler runs fail (when it
// returns an error, that is the handler's error) and then records the event
// in the effect table.
func effectConsumer(t *testing.T, pg *testdb.PG, cfg inbox.Config, fail func(ctx context.Context, ev idem.Event) error) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	pg.Exec(t, `CREATE TABLE IF NOT EXISTS effect (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, aggregate text NOT NULL)`)
	if cfg.Name == "" {
		cfg.Name = "stock"
	}
	c, err := inbox.New(pg.Driver, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		if fail != nil {
			if err := fail(ctx, ev); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, aggregate) VALUES ($1, $2)`, ev.ID, ev.AggregateID)
		return err
	})
	return c
}

func delivery(t *testing.T, ev idem.Event) inbox.Delivery {
	t.Helper()
	m, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	return inbox.Delivery{Message: m, Source: "stock.events", Attempt: 1}
}

func deliver(t *testing.T, c *inbox.Consumer[pgx.Tx], ds ...inbox.Delivery) []inbox.Disposition {
	t.Helper()
	disps, errs := c.DeliverBatch(context.Background(), ds)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	return disps
}

var fastPause = inbox.Config{PauseMin: 20 * time.Millisecond, PauseMax: 50 * time.Millisecond}

// A handler's transient failure pauses the consumer: no attempt is counted,
// nothing is parked, deliveries during the pause are answered without
// running the handler, and the first delivery after it succeeds.
func TestTransientFailurePausesWithoutCountingAttempts(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	var calls, failures atomic.Int32
	failures.Store(3)
	c := effectConsumer(t, pg, fastPause, func(ctx context.Context, ev idem.Event) error {
		calls.Add(1)
		if failures.Add(-1) >= 0 {
			return idem.Transient(errors.New("carrier answers 503"))
		}
		return nil
	})
	d := delivery(t, placed(t, "1"))
	for range 3 {
		got := deliver(t, c, d)[0]
		if got.Action != inbox.Pause || got.Outcome != inbox.Paused || got.RetryAfter <= 0 || got.RetryAfter > fastPause.PauseMax {
			t.Fatalf("transient failure: %+v; want Pause with a delay up to %v", got, fastPause.PauseMax)
		}
		if c.Stats().PausedSince.IsZero() {
			t.Fatal("Stats().PausedSince is zero while paused")
		}
		// During the pause, the consumer does not run the handler.
		before := calls.Load()
		if again := deliver(t, c, d)[0]; again.Action != inbox.Pause || calls.Load() != before {
			t.Fatalf("delivery during the pause: %+v, handler calls %d -> %d; want Pause without a call", again, before, calls.Load())
		}
		time.Sleep(got.RetryAfter)
	}
	if got := deliver(t, c, d)[0]; got.Action != inbox.Ack || got.Outcome != inbox.Applied {
		t.Fatalf("after the dependency's return: %+v; want applied", got)
	}
	if !c.Stats().PausedSince.IsZero() {
		t.Error("still paused after a success")
	}
	for _, table := range []string{"failed_message", "delivery_attempt"} {
		if n := pg.Count(t, table); n != 0 {
			t.Errorf("%s rows: %d, want 0: a transient failure costs no attempt", table, n)
		}
	}
}

// An event that keeps failing transiently beyond the outage budget has its
// failures counted, and is parked when the retry policy runs out.
func TestTransientFailuresCountAfterTheOutageBudget(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	cfg := fastPause
	cfg.OutageBudget = 100 * time.Millisecond
	cfg.Retry = inbox.RetryPolicy{MaxRetries: 1, InitialDelay: time.Millisecond, Jitter: -1}
	c := effectConsumer(t, pg, cfg, func(ctx context.Context, ev idem.Event) error {
		return idem.Transient(errors.New("always away"))
	})
	d := delivery(t, placed(t, "1"))
	deadline := time.Now().Add(10 * time.Second)
	var got inbox.Disposition
	for got.Outcome != inbox.Parked {
		if time.Now().After(deadline) {
			t.Fatalf("not parked after 10s; last disposition %+v", got)
		}
		got = deliver(t, c, d)[0]
		time.Sleep(got.RetryAfter)
	}
	if got.Attempts != 2 {
		t.Errorf("parked after %d attempts, want 2 (MaxRetries 1)", got.Attempts)
	}
}

// While the consumer's own database is unreachable, deliveries pause
// (decodable or not): nothing can be parked, nothing is lost.
func TestDatabaseDownPauses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://idem@127.0.0.1:1/nowhere?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := inbox.New(postgres.NewPgx(pool), inbox.Config{Name: "stock", PauseMin: time.Millisecond, PauseMax: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(context.Context, pgx.Tx, idem.Event) error { return nil })
	good := delivery(t, placed(t, "1"))
	bad := inbox.Delivery{Message: idem.Message{Body: []byte("not json")}, Source: "stock.events"}
	for _, d := range []inbox.Delivery{good, bad} {
		time.Sleep(10 * time.Millisecond) // past any pause
		got, err := c.Deliver(ctx, d)
		if err != nil || got.Action != inbox.Pause {
			t.Fatalf("database down: %+v, %v; want Pause and no error", got, err)
		}
	}
}

// Failed attempts are counted in the database: a consumer that restarts
// (a new Consumer value, as after a crash or a Kafka rebalance) goes on
// counting, and parks at the policy's last attempt.
func TestAttemptsSurviveARestart(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	cfg := inbox.Config{Retry: inbox.RetryPolicy{MaxRetries: 2, InitialDelay: time.Millisecond, Jitter: -1}}
	fail := func(context.Context, idem.Event) error { return errors.New("no such warehouse") }
	d := delivery(t, placed(t, "1"))
	for attempt := 1; attempt <= 3; attempt++ {
		c := effectConsumer(t, pg, cfg, fail) // a fresh process each time
		got := deliver(t, c, d)[0]
		want := inbox.Retry
		if attempt == 3 {
			want = inbox.Ack
		}
		if got.Action != want || got.Attempts != attempt {
			t.Fatalf("attempt %d: %+v; want %v with %d attempts counted", attempt, got, want, attempt)
		}
	}
	list, err := effectConsumer(t, pg, cfg, fail).Failures().List(context.Background(), idem.FailedFilter{})
	if err != nil || len(list) != 1 || list[0].Attempts != 3 {
		t.Fatalf("failure store: %+v, %v; want one entry after 3 attempts", list, err)
	}
	if n := pg.Count(t, "delivery_attempt"); n != 0 {
		t.Errorf("delivery_attempt rows after parking: %d, want 0 (a retry from the store starts again)", n)
	}
}

// Within one delivery, once an event of an aggregate waits for a retry, the
// later events of that aggregate are not attempted; other aggregates go on.
func TestLaterEventsOfAnAggregateWaitBehindARetry(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	a1, a2, a3, b1 := placed(t, "A"), placed(t, "A"), placed(t, "A"), placed(t, "B")
	var failA1 atomic.Bool
	failA1.Store(true)
	c := effectConsumer(t, pg, inbox.Config{}, func(ctx context.Context, ev idem.Event) error {
		if ev.ID == a1.ID && failA1.Load() {
			return errors.New("stock service busy")
		}
		return nil
	})
	got := deliver(t, c, delivery(t, a1), delivery(t, b1), delivery(t, a2), delivery(t, a3))
	if got[0].Action != inbox.Retry || got[0].Outcome != inbox.Failed {
		t.Errorf("failing event: %+v, want Retry", got[0])
	}
	if got[1].Outcome != inbox.Applied {
		t.Errorf("other aggregate: %+v, want applied", got[1])
	}
	for _, d := range got[2:] {
		if d.Action != inbox.Retry || d.Outcome != inbox.Deferred || d.RetryAfter != got[0].RetryAfter {
			t.Errorf("later event of the failing aggregate: %+v, want deferred with the same delay", d)
		}
	}
	failA1.Store(false)
	for _, d := range deliver(t, c, delivery(t, a1), delivery(t, a2), delivery(t, a3)) {
		if d.Outcome != inbox.Applied {
			t.Fatalf("after the retry: %+v, want applied", d)
		}
	}
	rows, err := pg.Pool.Query(context.Background(), `SELECT event_id::text FROM effect WHERE aggregate = 'A' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 || ids[0] != a1.ID.String() || ids[1] != a2.ID.String() || ids[2] != a3.ID.String() {
		t.Errorf("aggregate A applied as %v; want %s, %s, %s", ids, a1.ID, a2.ID, a3.ID)
	}
}

// A parked event holds its aggregate: the later events of that aggregate
// are parked behind it, in the same delivery and in later ones, until it is
// re-driven; re-driving it is not held by itself. With ReleaseAggregate
// they are applied.
func TestParkedEventHoldsItsAggregate(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	a1, a2, a3, b1 := placed(t, "A"), placed(t, "A"), placed(t, "A"), placed(t, "B")
	var bad atomic.Bool
	bad.Store(true)
	fail := func(ctx context.Context, ev idem.Event) error {
		if ev.ID == a1.ID && bad.Load() {
			return idem.Permanent(errors.New("unknown product"))
		}
		return nil
	}
	c := effectConsumer(t, pg, inbox.Config{}, fail)
	got := deliver(t, c, delivery(t, a1), delivery(t, b1), delivery(t, a2))
	if got[0].Outcome != inbox.Parked || got[1].Outcome != inbox.Applied || got[2].Outcome != inbox.Parked {
		t.Fatalf("dispositions %v, %v, %v; want parked, applied, parked behind", got[0].Outcome, got[1].Outcome, got[2].Outcome)
	}
	if got := deliver(t, c, delivery(t, a3))[0]; got.Outcome != inbox.Parked {
		t.Fatalf("a later delivery of the held aggregate: %+v; want parked behind the first", got)
	}
	ctx := context.Background()
	list, err := c.Failures().List(ctx, idem.FailedFilter{Consumer: "stock"})
	if err != nil || len(list) != 3 {
		t.Fatalf("failure store: %d entries, %v; want 3", len(list), err)
	}
	var root int64
	for _, m := range list {
		if m.EventID == a1.ID {
			root = m.ID
			if m.HeldBy != 0 || m.AggregateID != "A" || m.AggregateType != "order" {
				t.Errorf("root entry %+v; want aggregate order A, held by nothing", m)
			}
		}
	}
	for _, m := range list {
		if m.EventID != a1.ID && m.HeldBy != root {
			t.Errorf("entry of %s held by %d, want %d", m.EventID, m.HeldBy, root)
		}
	}
	if st := c.Stats(); st.HeldBack != 2 {
		t.Errorf("Stats().HeldBack = %d, want 2", st.HeldBack)
	}

	// The operator fixes the cause and re-drives them, oldest first (idem
	// failed retry marks each copy with its failure store id): the first is
	// not held behind itself, and each applied copy leaves the store.
	bad.Store(false)
	redrive := func(m idem.FailedMessage) inbox.Delivery {
		d := inbox.Delivery{Message: idem.Message{EventID: m.EventID, EventName: m.EventName, Key: m.Key,
			Headers: map[string]string{idem.HeaderRedrive: strconv.FormatInt(m.ID, 10)}, Body: m.Body}, Source: m.Source}
		for k, v := range m.Headers {
			d.Message.Headers[k] = v
		}
		return d
	}
	slices.SortFunc(list, func(a, b idem.FailedMessage) int { return cmp.Compare(a.ID, b.ID) })
	// A later event re-driven before the first is still held.
	if got := deliver(t, c, redrive(list[2]))[0]; got.Outcome != inbox.Parked {
		t.Fatalf("re-driven later event while the first is parked: %+v; want parked again", got)
	}
	for _, m := range list {
		if got := deliver(t, c, redrive(m))[0]; got.Outcome != inbox.Applied {
			t.Fatalf("re-driven %s: %+v; want applied", m.EventID, got)
		}
	}
	if n := pg.Count(t, "failed_message"); n != 0 {
		t.Errorf("failure store after the re-drive: %d entries, want 0", n)
	}
	if n := pg.Count(t, "effect WHERE aggregate = 'A'"); n != 3 {
		t.Errorf("effects of aggregate A: %d, want 3", n)
	}

	// With ReleaseAggregate, a parked event holds nothing back.
	pg2 := testdb.NewPostgres(t)
	bad.Store(true)
	r := effectConsumer(t, pg2, inbox.Config{Parked: inbox.ReleaseAggregate}, fail)
	got = deliver(t, r, delivery(t, a1), delivery(t, a2))
	if got[0].Outcome != inbox.Parked || got[1].Outcome != inbox.Applied {
		t.Fatalf("ReleaseAggregate: %v, %v; want parked, applied", got[0].Outcome, got[1].Outcome)
	}
}

// An event id that comes back with other content is still a duplicate, but
// the consumer says so and counts it.
func TestDuplicateWithOtherContentIsCounted(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	c := effectConsumer(t, pg, inbox.Config{}, nil)
	ctx := context.Background()
	ev := placed(t, "1")
	o, err := c.Process(ctx, ev)
	must(t, o, err, inbox.Applied)
	o, err = c.Process(ctx, ev)
	must(t, o, err, inbox.Duplicate)
	if n := c.Stats().Conflicts; n != 0 {
		t.Fatalf("conflicts after an identical copy: %d, want 0", n)
	}
	other := ev
	other.Payload = []byte(`{"orderId":"1","lines":[{"productId":"p-1","quantity":"-7"}]}`)
	o, err = c.Process(ctx, other)
	must(t, o, err, inbox.Duplicate)
	if n := c.Stats().Conflicts; n != 1 {
		t.Errorf("conflicts after a copy with another payload: %d, want 1", n)
	}
}

// A handler that outlives the delivery timeout is cancelled; the failure is
// transient (a dependency that hangs): no attempt is counted.
func TestDeliveryTimeout(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	cfg := fastPause
	cfg.DeliveryTimeout = 100 * time.Millisecond
	c := effectConsumer(t, pg, cfg, func(ctx context.Context, ev idem.Event) error {
		<-ctx.Done()
		return ctx.Err()
	})
	start := time.Now()
	got := deliver(t, c, delivery(t, placed(t, "1")))[0]
	if got.Action != inbox.Pause || time.Since(start) > 5*time.Second {
		t.Fatalf("hanging handler: %+v after %v; want Pause soon after the 100ms timeout", got, time.Since(start))
	}
	if n := pg.Count(t, "delivery_attempt"); n != 0 {
		t.Errorf("delivery_attempt rows: %d, want 0", n)
	}
}

// A message whose event name and aggregate are too long or not printable
// for the failure store's name columns (VARCHAR(255) on MySQL) is still
// parked, with its raw bytes, and still holds its aggregate.
func TestHostileNamesAreParked(t *testing.T) {
	t.Parallel()
	my := testdb.NewMariaDB(t)
	c, err := inbox.New(my.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(context.Context, *sql.Tx, idem.Event) error {
		return idem.Permanent(errors.New("rejected"))
	})
	long := strings.Repeat("\xffé\x01", 400)
	body := []byte(`{"orderId":1}`)
	headers := map[string]string{idem.HeaderEventID: idem.NewEventID().String(), idem.HeaderEventType: long}
	d := inbox.Delivery{Message: idem.Message{AggregateType: long, Key: []byte(long), Headers: headers, Body: body}, Source: "stock.events"}
	got, err := c.Deliver(context.Background(), d)
	if err != nil || got.Outcome != inbox.Parked {
		t.Fatalf("message with long, binary names: %+v, %v; want parked", got, err)
	}
	list, err := c.Failures().List(context.Background(), idem.FailedFilter{})
	if err != nil || len(list) != 1 {
		t.Fatalf("failure store: %v, %v", list, err)
	}
	if m := list[0]; m.Headers[idem.HeaderEventType] != long || string(m.Key) != long || string(m.Body) != string(body) {
		t.Errorf("the raw message did not read back byte for byte")
	}
	// The next message of that aggregate is held behind it.
	headers2 := map[string]string{idem.HeaderEventID: idem.NewEventID().String(), idem.HeaderEventType: long}
	d2 := inbox.Delivery{Message: idem.Message{AggregateType: long, Key: []byte(long), Headers: headers2, Body: body}, Source: "stock.events"}
	if got, err := c.Deliver(context.Background(), d2); err != nil || got.Outcome != inbox.Parked || !strings.Contains(got.Err.Error(), "held behind") {
		t.Fatalf("next message of the aggregate: %+v, %v; want parked behind the first", got, err)
	}
}
