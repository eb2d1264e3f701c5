package drivertest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/internal/testsvc"
)

// Consumer checks inbox.Consumer's failure model on the database, through
// Deliver and DeliverBatch as a transport calls them: a missing table says
// to migrate; failed attempts are counted in the database (a new consumer
// goes on counting), retried with the policy's delays and parked at the
// last one, with the raw message, and parked again in the same entry; an
// undecodable message or a permanent error is parked at once, byte for
// byte; a parked event holds the later events of its aggregate until it is
// re-driven; a re-driven message that fails again is parked in the entry it
// came from, with or without event id; another message reusing a parked
// event id gets an entry of its own and never takes the first's hold or
// entry; names too long or not printable for the failure store's columns
// are parked all the same; a duplicate with other content is counted.
func Consumer[TTx any](t *testing.T, setup Setup[TTx]) {
	t.Run("MissingTableSaysToMigrate", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{NoMigrate: true})
		c := consumer(t, db, "stock", nil)
		_, err := c.Process(testsvc.Ctx(t, time.Minute), placed(t, "1"))
		if !errors.Is(err, idem.ErrMissingTable) || !strings.Contains(err.Error(), "idem migrate up") {
			t.Fatalf("err = %v; want ErrMissingTable telling to run idem migrate up", err)
		}
	})
	t.Run("RetriesThenParks", func(t *testing.T) {
		t.Parallel()
		retriesThenParks(t, setup)
	})
	t.Run("AttemptsSurviveARestart", func(t *testing.T) {
		t.Parallel()
		attemptsSurviveARestart(t, setup)
	})
	t.Run("UndecodableAndPermanentParkedAtOnce", func(t *testing.T) {
		t.Parallel()
		parkedAtOnce(t, setup)
	})
	t.Run("ParkedEventHoldsItsAggregate", func(t *testing.T) {
		t.Parallel()
		parkedHolds(t, setup)
	})
	t.Run("RedrivenAndFailingAgainKeepsOneEntry", func(t *testing.T) {
		t.Parallel()
		redrivenKeepsOneEntry(t, setup)
	})
	t.Run("ReusedEventIDGetsItsOwnEntry", func(t *testing.T) {
		t.Parallel()
		reusedEventIDOwnEntry(t, setup)
	})
	t.Run("HostileNamesAreParked", func(t *testing.T) {
		t.Parallel()
		hostileNamesParked(t, setup)
	})
	t.Run("DuplicateWithOtherContentIsCounted", func(t *testing.T) {
		t.Parallel()
		duplicateOtherContent(t, setup)
	})
}

func delivery(t *testing.T, ev idem.Event) inbox.Delivery {
	t.Helper()
	m, err := idem.NewMessage(ev)
	fatalIf(t, err, "message")
	return inbox.Delivery{Message: m, Source: "stock.events", Attempt: 1}
}

// deliver calls DeliverBatch and fails the test on an error.
func deliver[TTx any](t *testing.T, c *inbox.Consumer[TTx], ds ...inbox.Delivery) []inbox.Disposition {
	t.Helper()
	disps, errs := c.DeliverBatch(testsvc.Ctx(t, time.Minute), ds)
	for i, err := range errs {
		fatalIf(t, err, "delivery %d", i)
	}
	return disps
}

// retriesThenParks: a handler that keeps failing is retried after the
// policy's delays, then parked with the raw message, its headers, its
// attempts and one history entry; retried from the store and failing
// again, it is parked again in the same entry, whose history grows; then
// removed.
func retriesThenParks[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	db.exec(t, reservationTable)
	ctx := testsvc.Ctx(t, time.Minute)
	fail := errors.New("database of the carrier is down")
	c := consumerWith(t, db, inbox.Config{Name: "stock", Retry: inbox.RetryPolicy{MaxRetries: 2, InitialDelay: time.Second, Jitter: -1}},
		func(context.Context, driver.Executor, idem.Event) error { return fail })
	msg, err := idem.NewMessage(placed(t, "9"))
	fatalIf(t, err, "message")
	msg.Headers = map[string]string{"x-trace": "abc"}
	for attempt, wantDelay := range []time.Duration{time.Second, 2 * time.Second} {
		d, err := c.Deliver(ctx, inbox.Delivery{Message: msg, Source: "stock.events", Attempt: attempt + 1})
		if err != nil || d.Action != inbox.Retry || d.RetryAfter != wantDelay || d.Attempts != attempt+1 {
			t.Fatalf("attempt %d: %+v, %v; want Retry after %v", attempt+1, d, err, wantDelay)
		}
	}
	d, err := c.Deliver(ctx, inbox.Delivery{Message: msg, Source: "stock.events", Attempt: 3})
	if err != nil || d.Action != inbox.Ack || d.Outcome != inbox.Parked {
		t.Fatalf("last attempt: %+v, %v; want parked and acked", d, err)
	}
	list, err := c.Failures().List(ctx, idem.FailedFilter{Consumer: "stock"})
	if err != nil || len(list) != 1 {
		t.Fatalf("failure store = %v, %v; want one entry", list, err)
	}
	got := list[0]
	if string(got.Body) != string(msg.Body) || got.Headers["x-trace"] != "abc" || got.Attempts != 3 ||
		got.EventID != msg.EventID || got.Source != "stock.events" || len(got.History) != 1 || !errors.Is(d.Err, fail) {
		t.Errorf("stored failure = %+v; want the raw message, its headers, 3 attempts and one history entry", got)
	}
	if n := db.count(t, "delivery_attempt"); n != 0 {
		t.Errorf("delivery_attempt rows after parking: %d, want 0 (a retry from the store starts again)", n)
	}

	// Retried from the store, it fails three more times and is parked
	// again: the same entry, whose history grows.
	for range 3 {
		_, err := c.Deliver(ctx, inbox.Delivery{Message: msg, Source: "stock.events", Attempt: 1})
		fatalIf(t, err, "deliver again")
	}
	again, err := c.Failures().Get(ctx, got.ID)
	if err != nil || len(again.History) != 2 {
		t.Fatalf("after a second park: %+v, %v; want 2 history entries on the same entry", again, err)
	}
	if ok, err := c.Failures().Remove(ctx, got.ID); !ok || err != nil {
		t.Fatalf("remove = %v, %v", ok, err)
	}
	if _, err := c.Failures().Get(ctx, got.ID); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("get after remove: %v, want ErrNotFound", err)
	}
	if n := db.count(t, "reservation") + db.count(t, "processed_event"); n != 0 {
		t.Errorf("rows left by failed attempts: %d, want 0", n)
	}
}

// attemptsSurviveARestart: failed attempts are counted in the database,
// whatever attempt the transport says it is: a consumer that restarts (a
// new Consumer value, as after a crash or a Kafka rebalance) goes on
// counting, and parks at the policy's last attempt.
func attemptsSurviveARestart[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	db.exec(t, reservationTable)
	cfg := inbox.Config{Name: "stock", Retry: inbox.RetryPolicy{MaxRetries: 2, InitialDelay: time.Millisecond, Jitter: -1}}
	fail := func(context.Context, driver.Executor, idem.Event) error { return errors.New("no such warehouse") }
	d := delivery(t, placed(t, "1"))
	for attempt := 1; attempt <= 3; attempt++ {
		c := consumerWith(t, db, cfg, fail) // a fresh process each time
		got := deliver(t, c, d)[0]
		want := inbox.Retry
		if attempt == 3 {
			want = inbox.Ack
		}
		if got.Action != want || got.Attempts != attempt {
			t.Fatalf("attempt %d: %+v; want %v with %d attempts counted", attempt, got, want, attempt)
		}
	}
	list, err := consumerWith(t, db, cfg, fail).Failures().List(testsvc.Ctx(t, time.Minute), idem.FailedFilter{})
	if err != nil || len(list) != 1 || list[0].Attempts != 3 {
		t.Fatalf("failure store: %+v, %v; want one entry after 3 attempts", list, err)
	}
	if n := db.count(t, "delivery_attempt"); n != 0 {
		t.Errorf("delivery_attempt rows after parking: %d, want 0 (a retry from the store starts again)", n)
	}
}

// parkedAtOnce: an undecodable body and a handler's permanent error are
// parked at once, the body byte for byte.
func parkedAtOnce[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	db.exec(t, reservationTable)
	ctx := testsvc.Ctx(t, time.Minute)
	c := consumer(t, db, "stock", func(context.Context, driver.Executor, idem.Event) error {
		return idem.Permanent(errors.New("unknown product"))
	})
	raw := []byte("not json \x00\xff")
	d, err := c.Deliver(ctx, inbox.Delivery{Message: idem.Message{Body: raw}, Source: "stock.events", Attempt: 1})
	if err != nil || d.Action != inbox.Ack || d.Outcome != inbox.Parked || !errors.Is(d.Err, idem.ErrUndecodable) {
		t.Fatalf("undecodable: %+v, %v; want parked at once", d, err)
	}
	msg, err := idem.NewMessage(placed(t, "1"))
	fatalIf(t, err, "message")
	d, err = c.Deliver(ctx, inbox.Delivery{Message: msg, Attempt: 1})
	if err != nil || d.Action != inbox.Ack || d.Outcome != inbox.Parked || d.Attempts != 1 {
		t.Fatalf("permanent error: %+v, %v; want parked at once", d, err)
	}
	list, err := c.Failures().List(ctx, idem.FailedFilter{})
	if err != nil || len(list) != 2 {
		t.Fatalf("failure store: %d entries, %v; want 2", len(list), err)
	}
	if string(list[1].Body) != string(raw) {
		t.Errorf("raw body = %q, want %q byte for byte", list[1].Body, raw)
	}
	if string(list[0].Body) != string(msg.Body) || list[0].EventID != msg.EventID {
		t.Errorf("parked event = %+v, want the message as delivered", list[0])
	}
	if n := db.count(t, "reservation") + db.count(t, "processed_event") + db.count(t, "delivery_attempt"); n != 0 {
		t.Errorf("rows left by parked messages: %d, want 0", n)
	}
}

// parkedHolds: a parked event holds its aggregate: the later events of that
// aggregate are parked behind it, in the same delivery and in later ones,
// until it is re-driven; re-driving it is not held by itself. With
// ReleaseAggregate they are applied.
func parkedHolds[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	db.exec(t, `CREATE TABLE reservation (order_id VARCHAR(64) NOT NULL, product_id VARCHAR(100) NOT NULL, quantity INTEGER NOT NULL)`)
	ctx := testsvc.Ctx(t, time.Minute)
	a1, a2, a3, b1 := placed(t, "A"), placed(t, "A"), placed(t, "A"), placed(t, "B")
	var bad atomic.Bool
	bad.Store(true)
	fail := func(_ context.Context, _ driver.Executor, ev idem.Event) error {
		if ev.ID == a1.ID && bad.Load() {
			return idem.Permanent(errors.New("unknown product"))
		}
		return nil
	}
	c := consumer(t, db, "stock", fail)
	got := deliver(t, c, delivery(t, a1), delivery(t, b1), delivery(t, a2))
	if got[0].Outcome != inbox.Parked || got[1].Outcome != inbox.Applied || got[2].Outcome != inbox.Parked {
		t.Fatalf("dispositions %v, %v, %v; want parked, applied, parked behind", got[0].Outcome, got[1].Outcome, got[2].Outcome)
	}
	if got := deliver(t, c, delivery(t, a3))[0]; got.Outcome != inbox.Parked {
		t.Fatalf("a later delivery of the held aggregate: %+v; want parked behind the first", got)
	}
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
	if n := db.count(t, "failed_message"); n != 0 {
		t.Errorf("failure store after the re-drive: %d entries, want 0", n)
	}
	if n := db.count(t, "reservation WHERE order_id = 'A'"); n != 3 {
		t.Errorf("effects of aggregate A: %d, want 3", n)
	}

	// With ReleaseAggregate, a parked event holds nothing back.
	bad.Store(true)
	r := consumerWith(t, db, inbox.Config{Name: "billing", Parked: inbox.ReleaseAggregate}, fail)
	got = deliver(t, r, delivery(t, a1), delivery(t, a2))
	if got[0].Outcome != inbox.Parked || got[1].Outcome != inbox.Applied {
		t.Fatalf("ReleaseAggregate: %v, %v; want parked, applied", got[0].Outcome, got[1].Outcome)
	}
}

// hostileNamesParked: a message whose event name and aggregate are too long
// or not printable for the failure store's name columns (VARCHAR(255) on
// MySQL) is still parked, with its raw bytes, and still holds its
// aggregate.
func hostileNamesParked[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	c, err := inbox.New(db.Driver, inbox.Config{Name: "stock", Logger: testlog.New(t)})
	fatalIf(t, err, "new consumer")
	c.Handle(inbox.AnyEvent, func(context.Context, TTx, idem.Event) error {
		return idem.Permanent(errors.New("rejected"))
	})
	long := strings.Repeat("\xffé\x01", 400)
	body := []byte(`{"orderId":1}`)
	message := func() inbox.Delivery {
		headers := map[string]string{idem.HeaderEventID: idem.NewEventID().String(), idem.HeaderEventType: long}
		return inbox.Delivery{Message: idem.Message{AggregateType: long, Key: []byte(long), Headers: headers, Body: body}, Source: "stock.events"}
	}
	got, err := c.Deliver(ctx, message())
	if err != nil || got.Outcome != inbox.Parked {
		t.Fatalf("message with long, binary names: %+v, %v; want parked", got, err)
	}
	list, err := c.Failures().List(ctx, idem.FailedFilter{})
	if err != nil || len(list) != 1 {
		t.Fatalf("failure store: %v, %v", list, err)
	}
	if m := list[0]; m.Headers[idem.HeaderEventType] != long || string(m.Key) != long || string(m.Body) != string(body) {
		t.Errorf("the raw message did not read back byte for byte")
	}
	// The next message of that aggregate is held behind it.
	if got, err := c.Deliver(ctx, message()); err != nil || got.Outcome != inbox.Parked || !strings.Contains(got.Err.Error(), "held behind") {
		t.Fatalf("next message of the aggregate: %+v, %v; want parked behind the first", got, err)
	}
}

// duplicateOtherContent: an event id that comes back with other content is
// still a duplicate, but the consumer says so and counts it, by the hash
// kept with the first one's marker.
func duplicateOtherContent[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	db.exec(t, reservationTable)
	ctx := testsvc.Ctx(t, time.Minute)
	c := consumer(t, db, "stock", nil)
	ev := placed(t, "1")
	o, err := c.Process(ctx, ev)
	must(t, o, err, inbox.Applied)
	o, err = c.Process(ctx, ev)
	must(t, o, err, inbox.Duplicate)
	if n := c.Stats().Conflicts; n != 0 {
		t.Fatalf("conflicts after an identical copy: %d, want 0", n)
	}
	other := ev
	other.Payload = []byte(`{"order_id":"1","lines":[{"productId":"p-1","quantity":"-7"}]}`)
	o, err = c.Process(ctx, other)
	must(t, o, err, inbox.Duplicate)
	if n := c.Stats().Conflicts; n != 1 {
		t.Errorf("conflicts after a copy with another payload: %d, want 1", n)
	}
	// In a batch too, where the duplicate's hash is read with others.
	res := c.ProcessBatch(ctx, []idem.Event{other, placed(t, "2")})
	if res[0].Outcome != inbox.Duplicate || res[1].Outcome != inbox.Applied {
		t.Fatalf("batch = %+v, want Duplicate then Applied", res)
	}
	if n := c.Stats().Conflicts; n != 2 {
		t.Errorf("conflicts after a batch with a copy of another payload: %d, want 2", n)
	}
}

// redeliveries records what Redeliver is asked to send, as a transport
// would send it back to its consumer.
type redeliveries struct{ msgs []inbox.Delivery }

// Redeliver implements broker.Redeliverer.
func (r *redeliveries) Redeliver(_ context.Context, source string, msgs []idem.Message) error {
	for _, m := range msgs {
		r.msgs = append(r.msgs, inbox.Delivery{Message: m, Source: source, Attempt: 1})
	}
	return nil
}

// redriveDelivery sends m back as "idem failed retry" does (inbox.Redrive)
// and returns the delivery its consumer gets.
func redriveDelivery(t *testing.T, m idem.FailedMessage) inbox.Delivery {
	t.Helper()
	var r redeliveries
	fatalIf(t, inbox.Redrive(testsvc.Ctx(t, time.Minute), &r, m), "redrive %d", m.ID)
	if len(r.msgs) != 1 {
		t.Fatalf("redrive %d sent %d messages, want 1", m.ID, len(r.msgs))
	}
	return r.msgs[0]
}

// redrivenKeepsOneEntry: an undecodable message, without event id, is
// parked; re-driven (marked with idem.HeaderRedrive, as idem failed retry
// does) it fails again and is parked in the same entry, twice: one entry,
// its attempts and history growing, its bytes and headers as first
// received, without the re-drive header. A header that names another
// message's entry, or another consumer's, updates nothing: those messages
// get entries of their own.
func redrivenKeepsOneEntry[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	c := consumer(t, db, "stock", nil)
	raw := []byte("not json \x00\xff")
	got, err := c.Deliver(ctx, inbox.Delivery{Message: idem.Message{Headers: map[string]string{"x-trace": "abc"}, Body: raw},
		Source: "stock.events", Attempt: 1})
	if err != nil || got.Outcome != inbox.Parked {
		t.Fatalf("undecodable message: %+v, %v; want parked", got, err)
	}
	list, err := c.Failures().List(ctx, idem.FailedFilter{})
	if err != nil || len(list) != 1 {
		t.Fatalf("failure store: %d entries, %v; want 1", len(list), err)
	}
	entry := list[0]
	if entry.EventID != uuid.Nil {
		t.Fatalf("undecodable message parked with event id %s, want none", entry.EventID)
	}
	for want := 2; want <= 3; want++ {
		d := redriveDelivery(t, entry)
		if d.Message.Headers[idem.HeaderRedrive] != strconv.FormatInt(entry.ID, 10) {
			t.Fatalf("re-driven copy headers %v, want %s=%d", d.Message.Headers, idem.HeaderRedrive, entry.ID)
		}
		if got := deliver(t, c, d)[0]; got.Outcome != inbox.Parked {
			t.Fatalf("re-driven undecodable message: %+v; want parked again", got)
		}
		list, err := c.Failures().List(ctx, idem.FailedFilter{})
		if err != nil || len(list) != 1 {
			t.Fatalf("after re-drive %d: %d entries, %v; want the one entry", want-1, len(list), err)
		}
		m := list[0]
		if m.ID != entry.ID || m.Attempts != want || len(m.History) != want {
			t.Errorf("after re-drive %d: entry %d, %d attempts, %d history records; want entry %d, %d and %d",
				want-1, m.ID, m.Attempts, len(m.History), entry.ID, want, want)
		}
		if !bytes.Equal(m.Body, raw) || !maps.Equal(m.Headers, map[string]string{"x-trace": "abc"}) || m.Source != "stock.events" {
			t.Errorf("after re-drive %d: body %q headers %v source %q; want the message as first received", want-1, m.Body, m.Headers, m.Source)
		}
	}

	// A header naming the entry on another message: a new entry, without
	// the header; the named entry is untouched.
	other := []byte("also not json")
	forged := inbox.Delivery{Message: idem.Message{Body: other,
		Headers: map[string]string{idem.HeaderRedrive: strconv.FormatInt(entry.ID, 10)}}, Source: "stock.events", Attempt: 1}
	if got := deliver(t, c, forged)[0]; got.Outcome != inbox.Parked {
		t.Fatalf("another message naming entry %d: %+v; want parked", entry.ID, got)
	}
	// The same bytes, re-driven to another consumer: an entry of its own.
	billing := consumer(t, db, "billing", nil)
	if got := deliver(t, billing, redriveDelivery(t, entry))[0]; got.Outcome != inbox.Parked {
		t.Fatalf("entry %d of stock re-driven to billing: %+v; want parked", entry.ID, got)
	}
	list, err = c.Failures().List(ctx, idem.FailedFilter{Oldest: true})
	if err != nil || len(list) != 3 {
		t.Fatalf("failure store: %d entries, %v; want 3", len(list), err)
	}
	if m := list[0]; m.ID != entry.ID || m.Attempts != 3 || !bytes.Equal(m.Body, raw) {
		t.Errorf("entry %d after the other messages: %d attempts, body %q; want 3 and %q", m.ID, m.Attempts, m.Body, raw)
	}
	if m := list[1]; m.Consumer != "stock" || !bytes.Equal(m.Body, other) || m.Attempts != 1 || len(m.Headers) != 0 {
		t.Errorf("the other message's entry: %s, body %q, %d attempts, headers %v; want stock's, its own body, 1 attempt, no header",
			m.Consumer, m.Body, m.Attempts, m.Headers)
	}
	if m := list[2]; m.Consumer != "billing" || !bytes.Equal(m.Body, raw) || m.Attempts != 1 || m.Headers[idem.HeaderRedrive] != "" {
		t.Errorf("billing's entry: %s, body %q, %d attempts, headers %v; want billing's, 1 attempt, no re-drive header",
			m.Consumer, m.Body, m.Attempts, m.Headers)
	}
}

// reusedEventIDOwnEntry: a message whose event id is that of a parked
// message, but with another aggregate, is parked in an entry of its own:
// the first keeps its bytes and its hold, and each aggregate's later events
// wait behind its own parked message. A third message reusing the id, of
// the first's aggregate and that its handlers would apply, is not taken for
// the parked message sent again: it waits behind it, which stays parked.
func reusedEventIDOwnEntry[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	db.exec(t, reservationTable)
	ctx := testsvc.Ctx(t, time.Minute)
	c := consumer(t, db, "stock", func(_ context.Context, _ driver.Executor, ev idem.Event) error {
		if strings.Contains(string(ev.Payload), "unknown product") {
			return idem.Permanent(errors.New("unknown product"))
		}
		return nil
	})
	event := func(aggregate string, payload string) idem.Event {
		ev := placed(t, aggregate)
		ev.Payload = []byte(payload)
		return ev
	}
	first := event("A", `{"order_id":"A","product":"unknown product"}`)
	second := event("B", `{"order_id":"B","product":"unknown product"}`)
	second.ID = first.ID
	dFirst, dSecond := delivery(t, first), delivery(t, second)
	if got := deliver(t, c, dFirst)[0]; got.Outcome != inbox.Parked {
		t.Fatalf("first message: %+v; want parked", got)
	}
	if got := deliver(t, c, dSecond)[0]; got.Outcome != inbox.Parked {
		t.Fatalf("second message with the first's event id: %+v; want parked", got)
	}
	list, err := c.Failures().List(ctx, idem.FailedFilter{Oldest: true})
	if err != nil || len(list) != 2 {
		t.Fatalf("failure store: %d entries, %v; want one per message", len(list), err)
	}
	a, b := list[0], list[1]
	if !bytes.Equal(a.Body, dFirst.Message.Body) || a.AggregateID != "A" || a.HeldBy != 0 || a.EventID != first.ID {
		t.Errorf("first entry: aggregate %q, held by %d, body %s; want the first message, aggregate A", a.AggregateID, a.HeldBy, a.Body)
	}
	if !bytes.Equal(b.Body, dSecond.Message.Body) || b.AggregateID != "B" || b.HeldBy != 0 || b.EventID != first.ID {
		t.Errorf("second entry: aggregate %q, held by %d, body %s; want the second message, aggregate B", b.AggregateID, b.HeldBy, b.Body)
	}

	// Each aggregate's later events wait behind its own parked message.
	laterA, laterB := placed(t, "A"), placed(t, "B")
	got := deliver(t, c, delivery(t, laterA), delivery(t, laterB))
	if got[0].Outcome != inbox.Parked || got[1].Outcome != inbox.Parked {
		t.Fatalf("later events of A and B: %v, %v; want both held", got[0].Outcome, got[1].Outcome)
	}
	// A third message reusing the id, of aggregate A, that would apply.
	third := event("A", `{"order_id":"A","product":"p-1"}`)
	third.ID = first.ID
	if got := deliver(t, c, delivery(t, third))[0]; got.Outcome != inbox.Parked {
		t.Fatalf("another message reusing the parked event id on its aggregate: %+v; want held behind it", got)
	}
	list, err = c.Failures().List(ctx, idem.FailedFilter{Oldest: true})
	if err != nil || len(list) != 5 {
		t.Fatalf("failure store: %d entries, %v; want 5", len(list), err)
	}
	if list[0].ID != a.ID || !bytes.Equal(list[0].Body, dFirst.Message.Body) || list[0].AggregateID != "A" || list[0].HeldBy != 0 {
		t.Errorf("first entry now %d, aggregate %q, held by %d; want entry %d as it was", list[0].ID, list[0].AggregateID, list[0].HeldBy, a.ID)
	}
	held := map[uuid.UUID]int64{}
	for _, m := range list[2:] {
		held[m.EventID] = m.HeldBy
		if m.EventID == first.ID && !bytes.Equal(m.Body, delivery(t, third).Message.Body) {
			t.Errorf("entry %d of event %s holds %s, want the third message", m.ID, m.EventID, m.Body)
		}
	}
	if held[laterA.ID] != a.ID || held[laterB.ID] != b.ID || held[first.ID] != a.ID {
		t.Errorf("held by: later A %d, later B %d, third %d; want %d, %d, %d", held[laterA.ID], held[laterB.ID], held[first.ID], a.ID, b.ID, a.ID)
	}
	if n := db.count(t, "reservation") + db.count(t, "processed_event"); n != 0 {
		t.Errorf("rows applied while both aggregates are held: %d, want 0", n)
	}
}
