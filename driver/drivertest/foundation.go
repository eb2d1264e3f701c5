package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
)

// Migrations checks up, no-op, status, down, concurrent up, the refusal
// of a schema newer than the migrations known, and that the failure store's
// entries live through the migration that ends its unique event key.
func Migrations[TTx any](t *testing.T, setup Setup[TTx]) {
	t.Run("UpStatusDown", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{NoMigrate: true})
		ctx := testsvc.Ctx(t, time.Minute)
		m := migrate.New(db.Driver)
		known := db.Driver.Dialect().Migrations()
		if len(known) == 0 {
			t.Fatal("dialect has no migrations")
		}
		applied, err := m.Up(ctx)
		fatalIf(t, err, "up")
		if len(applied) != len(known) {
			t.Fatalf("up applied %d migrations, want %d", len(applied), len(known))
		}
		again, err := m.Up(ctx)
		fatalIf(t, err, "second up")
		if len(again) != 0 {
			t.Fatalf("second up applied %d migrations, want none", len(again))
		}
		st, err := m.Status(ctx)
		fatalIf(t, err, "status")
		for _, s := range st {
			if !s.Applied || s.Unknown {
				t.Errorf("status %+v: want applied and known", s)
			}
		}
		// The tables work.
		ev := placed(t, "1")
		fatalIf(t, outbox.NewWriter(db.Driver).AddExec(ctx, db.Driver.Pool(), ev), "insert after up")

		reverted, err := m.Down(ctx, 0)
		fatalIf(t, err, "down")
		if len(reverted) != len(known) {
			t.Fatalf("down reverted %d migrations, want %d", len(reverted), len(known))
		}
		err = outbox.NewWriter(db.Driver).AddExec(ctx, db.Driver.Pool(), placed(t, "2"))
		if !errors.Is(err, idem.ErrMissingTable) {
			t.Fatalf("insert after down: err = %v, want ErrMissingTable", err)
		}
		st, err = m.Status(ctx)
		fatalIf(t, err, "status after down")
		for _, s := range st {
			if s.Applied {
				t.Errorf("status after down %+v: want not applied", s)
			}
		}
		_, err = m.Up(ctx)
		fatalIf(t, err, "up after down")
	})

	t.Run("RefusesNewerSchema", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		ctx := testsvc.Ctx(t, time.Minute)
		db.exec(t, `INSERT INTO `+idem.MigrationTableDefault+` (version, name) VALUES (9999, 'from_the_future')`)
		_, err := migrate.New(db.Driver).Up(ctx)
		if !errors.Is(err, migrate.ErrSchemaNewer) {
			t.Fatalf("up on a newer schema: err = %v, want ErrSchemaNewer", err)
		}
		_, err = migrate.New(db.Driver).Down(ctx, 1)
		if !errors.Is(err, migrate.ErrSchemaNewer) {
			t.Fatalf("down on a newer schema: err = %v, want ErrSchemaNewer", err)
		}
		st, err := migrate.New(db.Driver).Status(ctx)
		fatalIf(t, err, "status")
		if last := st[len(st)-1]; last.Version != 9999 || !last.Unknown {
			t.Errorf("status ends with %+v, want the unknown version 9999", last)
		}
	})

	t.Run("ConcurrentUpAppliesOnce", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{NoMigrate: true})
		ctx := testsvc.Ctx(t, time.Minute)
		var (
			wg    sync.WaitGroup
			total atomic.Int32
			errs  = make(chan error, 4)
		)
		for range 4 {
			wg.Go(func() {
				applied, err := migrate.New(db.Driver).Up(ctx)
				if err != nil {
					errs <- err
					return
				}
				total.Add(int32(len(applied)))
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("concurrent up: %v", err)
		}
		if n := int(total.Load()); n != len(db.Driver.Dialect().Migrations()) {
			t.Errorf("concurrent ups applied %d migrations in all, want each once (%d)", n, len(db.Driver.Dialect().Migrations()))
		}
	})

	t.Run("CancelledUpLeavesNoHalfVersion", func(t *testing.T) {
		t.Parallel()
		cancelledUp(t, setup)
	})

	t.Run("FailureStoreKeyMigration", func(t *testing.T) {
		t.Parallel()
		failureStoreKeyMigration(t, setup)
	})
}

// failureStoreKeyMigration reverts and applies again migration 0007, which
// replaces failed_message's unique (consumer_name, event_id) key with a
// plain index, over entries holding hostile bytes, a held entry, an entry
// without event id and a gap left by a removed entry: every entry keeps its
// bytes each way (and reads back byte for byte through the dialect once
// the schema is current again), and ids are never reused. Reverted, the key
// is back: a second entry with an event id already stored is refused.
// Applied, it is accepted, and then the revert fails, changing nothing.
func failureStoreKeyMigration[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, 2*time.Minute)
	d, ex := db.Driver.Dialect(), db.Driver.Pool()
	m := migrate.New(db.Driver)
	const version = 7
	steps := 0
	for _, mig := range d.Migrations() {
		if mig.Version >= version {
			steps++
		}
	}
	if steps == 0 {
		t.Fatalf("the dialect has no migration %04d", version)
	}
	entries := []idem.FailedMessage{
		{Consumer: "stock\x00\xff", Source: `stock.events\`, EventID: idem.NewEventID(), EventName: "order.order.placed.v1\x00",
			AggregateType: "order", AggregateID: "42", Key: []byte("\x00\xff"), Headers: map[string]string{"x-\x00": "\xff"},
			Body: randomBytes(t, 1<<16), Error: hostileText(1000), Attempts: 3},
		{Consumer: "stock\x00\xff", EventID: idem.NewEventID(), AggregateType: "order", AggregateID: "42",
			Body: []byte("held"), Error: "held behind", Attempts: 1},
		{Consumer: "stock", Body: []byte("undecodable \x00"), Error: "undecodable", Attempts: 1},
	}
	for i := range entries {
		if i == 1 {
			entries[i].HeldBy = entries[0].ID
		}
		id, err := d.SaveFailed(ctx, ex, entries[i])
		fatalIf(t, err, "save entry %d", i)
		entries[i].ID = id
		entries[i].History = []idem.FailureRecord{{Attempt: entries[i].Attempts, Error: entries[i].Error}}
	}
	last, err := d.SaveFailed(ctx, ex, idem.FailedMessage{Consumer: "stock", EventID: idem.NewEventID(), Body: []byte("x"), Error: "x", Attempts: 1})
	fatalIf(t, err, "save the last entry")
	removed, err := d.DeleteFailed(ctx, ex, last)
	fatalIf(t, err, "remove the last entry")
	if !removed {
		t.Fatal("the last entry was not removed")
	}
	// check reads the entries back: through the dialect on the current
	// schema, by their bodies on an older one, which the dialect's reads
	// need not know (they select the columns of the later migrations).
	check := func(step string, current bool) {
		t.Helper()
		for _, w := range entries {
			if !current {
				var body []byte
				db.queryRow(t, `SELECT body FROM failed_message WHERE id = ?`, []any{w.ID}, &body)
				if !bytes.Equal(body, w.Body) {
					t.Errorf("%s: entry %d: body of %d bytes, want the %d saved (different)", step, w.ID, len(body), len(w.Body))
				}
				continue
			}
			got, err := d.GetFailed(ctx, ex, w.ID)
			fatalIf(t, err, "%s: get %d", step, w.ID)
			if err := sameFailed(got, w); err != nil {
				t.Errorf("%s: entry %d:\n%v", step, w.ID, err)
			}
		}
		if n := db.count(t, "failed_message"); n != len(entries) {
			t.Errorf("%s: %d entries, want %d", step, n, len(entries))
		}
	}
	// A second message with the first one's event id, as a consumer
	// saves it (no id: a new entry).
	dup := idem.FailedMessage{Consumer: entries[0].Consumer, EventID: entries[0].EventID, Body: []byte("another message"), Error: "boom", Attempts: 1}

	_, err = m.Down(ctx, steps)
	fatalIf(t, err, "revert migration %04d", version)
	check("reverted", false)
	if _, err := d.SaveFailed(ctx, ex, dup); !db.IsUniqueViolation(err, "failed_message", "failed_message_event_key") {
		t.Errorf("reverted: a second entry with a stored event id: err = %v, want the unique key's violation", err)
	}

	_, err = m.Up(ctx)
	fatalIf(t, err, "apply migration %04d again", version)
	check("applied again", true)
	id, err := d.SaveFailed(ctx, ex, dup)
	fatalIf(t, err, "applied: save a second entry with a stored event id")
	if id <= last {
		t.Errorf("applied: new entry %d, want an id after %d (removed), never used", id, last)
	}
	dup.ID = id
	dup.History = []idem.FailureRecord{{Attempt: 1, Error: "boom"}}
	entries = append(entries, dup)
	check("two entries with one event id", true)

	// The later migrations first (on MySQL each one is recorded as it
	// goes), then this one alone.
	if steps > 1 {
		_, err = m.Down(ctx, steps-1)
		fatalIf(t, err, "revert the migrations after %04d", version)
	}
	if _, err := m.Down(ctx, 1); err == nil {
		t.Fatalf("reverting migration %04d with two entries of one event id succeeded, want an error", version)
	}
	check("revert refused", false)
	st, err := m.Status(ctx)
	fatalIf(t, err, "status")
	for _, s := range st {
		if s.Version <= version && !s.Applied {
			t.Errorf("after a refused revert, version %d is not applied", s.Version)
		}
	}
	_, err = m.Up(ctx)
	fatalIf(t, err, "apply the migrations after %04d again", version)
	if _, err := d.SaveFailed(ctx, ex, idem.FailedMessage{Consumer: "stock", EventID: dup.EventID, Body: []byte("third"), Error: "x", Attempts: 1}); err != nil {
		t.Errorf("after a refused revert: a third entry with one event id: %v", err)
	}
}

// cancelledUp cancels "migrate up" after each of its first statements in
// turn, as a signal to "idem migrate up" would. Where DDL is transactional
// the cancelled run applies nothing; where it is not (MySQL), it finishes
// the version in progress. Either way the versions recorded are the
// versions applied: the next "migrate up" succeeds, and "migrate down"
// reverts every version.
func cancelledUp[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{NoMigrate: true})
	transactional := db.Driver.Dialect().MigrationSupport().TransactionalDDL
	for n := 1; n <= 12; n++ {
		ctx, cancel := context.WithCancel(context.Background())
		_, err := migrate.New[TTx](&cancelAfter[TTx]{Driver: db.Driver, n: n, cancel: cancel}).Up(ctx)
		cancel()
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("up cancelled after statement %d: %v; want a clean stop", n, err)
		}
		ctx = testsvc.Ctx(t, time.Minute)
		if err != nil && transactional {
			st, err := migrate.New(db.Driver).Status(ctx)
			fatalIf(t, err, "status after a cancelled up")
			for _, s := range st {
				if s.Applied {
					t.Fatalf("up cancelled after statement %d left version %d applied; with transactional DDL it rolls back", n, s.Version)
				}
			}
		}
		_, err = migrate.New(db.Driver).Up(ctx)
		fatalIf(t, err, "up after a run cancelled after statement %d (a version was left half applied)", n)
		reverted, err := migrate.New(db.Driver).Down(ctx, 0)
		fatalIf(t, err, "down after a run cancelled after statement %d", n)
		if len(reverted) != len(db.Driver.Dialect().Migrations()) {
			t.Fatalf("down after a run cancelled after statement %d reverted %d versions, want %d", n, len(reverted), len(db.Driver.Dialect().Migrations()))
		}
	}
}

// cancelAfter is a driver that cancels a context after the n-th statement
// run in its transactions.
type cancelAfter[TTx any] struct {
	driver.Driver[TTx]
	n      int
	seen   atomic.Int32
	cancel context.CancelFunc
}

func (c *cancelAfter[TTx]) Tx(tx TTx) driver.Executor { return cancelExec{c.Driver.Tx(tx), c.count} }

func (c *cancelAfter[TTx]) count() {
	if int(c.seen.Add(1)) == c.n {
		c.cancel()
	}
}

type cancelExec struct {
	driver.Executor
	count func()
}

func (e cancelExec) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	n, err := e.Executor.Exec(ctx, query, args...)
	e.count()
	return n, err
}

// Outbox checks that rows exist if and only if their transaction committed,
// with exactly the columns written, and that rows written with the five
// Debezium columns only get defaults.
func Outbox[TTx any](t *testing.T, setup Setup[TTx]) {
	t.Run("CommitAndRollback", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		ctx := testsvc.Ctx(t, time.Minute)
		w := outbox.NewWriter(db.Driver)

		kept := placed(t, "42")
		kept.AggregateVersion = 3
		kept.OccurredAt = time.Date(2026, 12, 2, 8, 0, 0, 123456789, time.UTC)
		kept.Headers = map[string]string{"traceparent": "00-abc-def-01", "é": "ü"}
		kept.Payload = []byte(`{"order_id":"42","lines":[{"sku":"A","qty":2}],"note":"crème"}`)
		tx, err := db.Driver.Begin(ctx)
		fatalIf(t, err, "begin")
		fatalIf(t, w.Add(ctx, tx, kept), "add")
		fatalIf(t, db.Driver.Commit(ctx, tx), "commit")

		lost := placed(t, "43")
		tx, err = db.Driver.Begin(ctx)
		fatalIf(t, err, "begin")
		fatalIf(t, w.Add(ctx, tx, lost, placed(t, "44")), "add")
		fatalIf(t, db.Driver.Rollback(ctx, tx), "rollback")

		if n := db.count(t, "outbox"); n != 1 {
			t.Fatalf("outbox rows = %d, want only the committed one", n)
		}
		var (
			id, aggType, aggID, typ string
			payload, headers        []byte
			at                      time.Time
			version                 int64
		)
		db.queryRow(t, `SELECT id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers FROM outbox`, nil,
			&id, &aggType, &aggID, &typ, &payload, timeScanner{&at}, &version, &headers)
		if id != kept.ID.String() || aggType != "order" || aggID != "42" || typ != kept.Name || version != 3 {
			t.Errorf("row = (%s, %s, %s, %s, v%d), want (%s, order, 42, %s, v3)", id, aggType, aggID, typ, version, kept.ID, kept.Name)
		}
		if !jsonEqual(payload, kept.Payload) {
			t.Errorf("payload = %s, want %s", payload, kept.Payload)
		}
		if want := kept.OccurredAt.Truncate(time.Microsecond); !at.Equal(want) {
			t.Errorf("occurred_at = %v, want %v (UTC, microseconds)", at, want)
		}
		if !jsonEqual(headers, []byte(`{"traceparent":"00-abc-def-01","é":"ü"}`)) {
			t.Errorf("headers = %s", headers)
		}

		// Many events in one call (more than one statement's worth).
		many := make([]idem.Event, 1500)
		for i := range many {
			many[i] = changed(t, fmt.Sprint("m", i%7), i)
		}
		tx, err = db.Driver.Begin(ctx)
		fatalIf(t, err, "begin")
		fatalIf(t, w.Add(ctx, tx, many...), "add many")
		fatalIf(t, db.Driver.Commit(ctx, tx), "commit")
		if n := db.count(t, "outbox"); n != 1501 {
			t.Errorf("outbox rows = %d, want 1501", n)
		}
	})

	t.Run("DebeziumColumnsOnly", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		id := idem.NewEventID()
		db.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', '42', 'OrderCreated', '{"orderId":42}')`, id.String())
		rows := claim(t, db, db.Driver.Dialect(), uuid.New(), time.Minute, 10, 10)
		if len(rows) != 1 {
			t.Fatalf("claimed %d rows, want 1", len(rows))
		}
		r := rows[0]
		if r.ID != id || r.AggregateVersion != 0 || len(r.Headers) != 0 || r.Seq <= 0 || r.Attempts != 0 {
			t.Errorf("row = %+v, want defaults (version 0, no headers, a seq)", r)
		}
		if r.OccurredAt.IsZero() || time.Since(r.OccurredAt) > time.Hour || time.Since(r.OccurredAt) < -time.Hour {
			t.Errorf("occurred_at = %v, want about now (UTC)", r.OccurredAt)
		}
		if !jsonEqual(r.Payload, []byte(`{"orderId":42}`)) {
			t.Errorf("payload = %s", r.Payload)
		}
	})
}

// hook is what a test adds to a consumer's handler: it runs in the
// handler's transaction, whose executor is ex.
type hook func(ctx context.Context, ex driver.Executor, ev idem.Event) error

// consumer returns a consumer named name whose handler, for every event,
// reserves stock in the reservation table (order: the aggregate id,
// product: the event id), then calls h (if any).
func consumer[TTx any](t *testing.T, db *DB[TTx], name string, h hook) *inbox.Consumer[TTx] {
	t.Helper()
	return consumerWith(t, db, inbox.Config{Name: name}, h)
}

// consumerWith is consumer with a configuration.
func consumerWith[TTx any](t *testing.T, db *DB[TTx], cfg inbox.Config, h hook) *inbox.Consumer[TTx] {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testlog.New(t)
	}
	c, err := inbox.New(db.Driver, cfg)
	fatalIf(t, err, "new consumer")
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx TTx, ev idem.Event) error {
		ex := db.Driver.Tx(tx)
		if _, err := ex.Exec(ctx, db.bind(`INSERT INTO reservation (order_id, product_id, quantity) VALUES (?, ?, 1)`),
			ev.AggregateID, "p-"+ev.ID.String()); err != nil {
			return err
		}
		if h != nil {
			return h(ctx, ex, ev)
		}
		return nil
	})
	return c
}

func must(t *testing.T, o inbox.Outcome, err error, want inbox.Outcome) {
	t.Helper()
	if o != want || err != nil {
		t.Fatalf("outcome = %v, %v; want %v", o, err, want)
	}
}

// Inbox checks deduplication: duplicates skipped, consumer names apart,
// concurrent deliveries applied once, only the processed_event key counts
// as a duplicate, and batches.
func Inbox[TTx any](t *testing.T, setup Setup[TTx]) {
	t.Run("DuplicateSkipped", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		db.exec(t, reservationTable)
		ctx := testsvc.Ctx(t, time.Minute)
		c := consumer(t, db, "stock", nil)
		ev := placed(t, "42")
		o, err := c.Process(ctx, ev)
		must(t, o, err, inbox.Applied)
		for range 2 {
			o, err = c.Process(ctx, ev)
			must(t, o, err, inbox.Duplicate)
		}
		if n := db.count(t, "reservation"); n != 1 {
			t.Errorf("reservations = %d, want 1", n)
		}
		if n := db.count(t, "processed_event WHERE consumer_name = 'stock' AND event_id = ?", ev.ID.String()); n != 1 {
			t.Errorf("markers = %d, want 1", n)
		}
	})

	t.Run("FailureLeavesNoMarker", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		db.exec(t, reservationTable)
		ctx := testsvc.Ctx(t, time.Minute)
		var fail atomic.Bool
		fail.Store(true)
		boom := errors.New("carrier down")
		// The handler writes its effect, then fails: both roll back.
		c := consumer(t, db, "stock", func(context.Context, driver.Executor, idem.Event) error {
			if fail.Load() {
				return boom
			}
			return nil
		})
		ev := placed(t, "42")
		o, err := c.Process(ctx, ev)
		var he *inbox.HandlerError
		if o != inbox.Failed || !errors.As(err, &he) || !errors.Is(err, boom) || he.EventID != ev.ID {
			t.Fatalf("outcome = %v, %v; want Failed with a *inbox.HandlerError of the handler's error", o, err)
		}
		if n := db.count(t, "reservation") + db.count(t, "processed_event"); n != 0 {
			t.Fatalf("rows after a failed attempt = %d, want 0", n)
		}
		fail.Store(false)
		o, err = c.Process(ctx, ev)
		must(t, o, err, inbox.Applied)
		if n := db.count(t, "reservation WHERE order_id = '42'"); n != 1 {
			t.Errorf("reservations after the retry = %d, want 1", n)
		}
	})

	t.Run("TwoConsumerNames", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		db.exec(t, `CREATE TABLE reservation (order_id VARCHAR(64) NOT NULL, product_id VARCHAR(100) NOT NULL, quantity INTEGER NOT NULL)`)
		ctx := testsvc.Ctx(t, time.Minute)
		stock := consumer(t, db, "stock", nil)
		shipping := consumer(t, db, "shipping-preparation-v1", nil)
		ev := placed(t, "42")
		for range 2 {
			_, err := stock.Process(ctx, ev)
			fatalIf(t, err, "stock")
			_, err = shipping.Process(ctx, ev)
			fatalIf(t, err, "shipping")
		}
		if n := db.count(t, "reservation"); n != 2 {
			t.Errorf("effects = %d, want one per consumer (2)", n)
		}
		for _, name := range []string{"stock", "shipping-preparation-v1"} {
			if n := db.count(t, "processed_event WHERE consumer_name = ?", name); n != 1 {
				t.Errorf("markers of %s = %d, want 1", name, n)
			}
		}
	})

	t.Run("UnrelatedUniqueViolationIsAnError", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		db.exec(t, reservationTable)
		ctx := testsvc.Ctx(t, time.Minute)
		ev := placed(t, "42")
		// Another event already reserved this (order, product) pair.
		db.exec(t, `INSERT INTO reservation (order_id, product_id, quantity) VALUES ('42', ?, 1)`, "p-"+ev.ID.String())
		c := consumer(t, db, "stock", nil)
		o, err := c.Process(ctx, ev)
		if o != inbox.Failed || !db.IsUniqueViolation(err, "reservation", "reservation_order_product") {
			t.Fatalf("outcome = %v, %v; want Failed with the reservation's unique violation", o, err)
		}
		if n := db.count(t, "processed_event"); n != 0 {
			t.Errorf("processed_event rows = %d, want 0: the event is not a duplicate", n)
		}
		// Also in a batch.
		res := c.ProcessBatch(ctx, []idem.Event{ev, placed(t, "43")})
		if res[0].Outcome != inbox.Failed || !db.IsUniqueViolation(res[0].Err, "reservation", "reservation_order_product") || res[1].Outcome != inbox.Applied {
			t.Errorf("batch = %+v, want Failed (unique violation) then Applied", res)
		}
	})

	for _, firstCommits := range []bool{true, false} {
		t.Run(fmt.Sprintf("ConcurrentDelivery/first_commits=%v", firstCommits), func(t *testing.T) {
			t.Parallel()
			concurrentDelivery(t, setup, firstCommits)
		})
	}

	t.Run("MarkProcessedMany", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		ctx := testsvc.Ctx(t, time.Minute)
		d := db.Driver.Dialect()
		ids := []uuid.UUID{idem.NewEventID(), idem.NewEventID(), idem.NewEventID(), idem.NewEventID()}
		marks := make([]driver.Mark, len(ids))
		for i, id := range ids {
			marks[i] = driver.Mark{ID: id, Hash: int64(i) * -0x1234_5678_9abc_def} // 0 for the first: unknown
		}
		got, err := d.MarkProcessed(ctx, db.Driver.Pool(), "stock", marks[1:2])
		fatalIf(t, err, "mark one")
		if !got[0] {
			t.Fatal("first marker not inserted")
		}
		tx := db.begin(t, ctx)
		other := marks[1]
		other.Hash = 42
		got, err = d.MarkProcessed(ctx, db.Driver.Tx(tx), "stock", []driver.Mark{marks[0], other, marks[2], marks[3]})
		fatalIf(t, err, "mark many")
		if want := []bool{true, false, true, true}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("inserted = %v, want %v", got, want)
		}
		// The transaction goes on after a duplicate.
		got, err = d.MarkProcessed(ctx, db.Driver.Tx(tx), "billing", marks)
		fatalIf(t, err, "mark for another consumer in the same transaction")
		if want := []bool{true, true, true, true}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("inserted for billing = %v, want %v", got, want)
		}
		fatalIf(t, db.Driver.Commit(ctx, tx), "commit")
		if n := db.count(t, "processed_event"); n != 8 {
			t.Errorf("markers = %d, want 8", n)
		}
		if n := db.count(t, "processed_event WHERE payload_hash IS NULL"); n != 2 {
			t.Errorf("markers without hash = %d, want 2 (hash 0 is stored NULL)", n)
		}

		// The hashes, the first one kept on a duplicate; none for an
		// unknown hash or a missing marker.
		missing := idem.NewEventID()
		hashes, err := d.ProcessedHashes(ctx, db.Driver.Pool(), "stock", append(ids, missing))
		fatalIf(t, err, "processed hashes")
		want := map[uuid.UUID]int64{ids[1]: marks[1].Hash, ids[2]: marks[2].Hash, ids[3]: marks[3].Hash}
		if !maps.Equal(hashes, want) {
			t.Errorf("hashes = %v, want %v", hashes, want)
		}
		if hashes, err := d.ProcessedHashes(ctx, db.Driver.Pool(), "shipping", ids); err != nil || len(hashes) != 0 {
			t.Errorf("hashes of another consumer = %v, %v; want none", hashes, err)
		}
		if hashes, err := d.ProcessedHashes(ctx, db.Driver.Pool(), "stock", nil); err != nil || len(hashes) != 0 {
			t.Errorf("hashes of no id = %v, %v; want none", hashes, err)
		}
	})

	t.Run("MarkProcessedThousands", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		ctx := testsvc.Ctx(t, time.Minute)
		d := db.Driver.Dialect()
		marks := make([]driver.Mark, 2500)
		ids := make([]uuid.UUID, len(marks))
		for i := range marks {
			marks[i] = driver.Mark{ID: idem.NewEventID(), Hash: int64(i + 1)}
			ids[i] = marks[i].ID
		}
		_, err := d.MarkProcessed(ctx, db.Driver.Pool(), "stock", marks[1200:1201])
		fatalIf(t, err, "mark one")
		got, err := d.MarkProcessed(ctx, db.Driver.Pool(), "stock", marks)
		fatalIf(t, err, "mark many")
		for i, ok := range got {
			if ok == (i == 1200) {
				t.Fatalf("inserted[%d] = %v", i, ok)
			}
		}
		hashes, err := d.ProcessedHashes(ctx, db.Driver.Pool(), "stock", ids)
		fatalIf(t, err, "hashes")
		if len(hashes) != len(ids) || hashes[ids[2499]] != 2500 {
			t.Errorf("hashes = %d, want %d", len(hashes), len(ids))
		}
	})

	t.Run("Batch", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		db.exec(t, reservationTable)
		ctx := testsvc.Ctx(t, time.Minute)
		var bad atomic.Value
		bad.Store("")
		c := consumer(t, db, "stock", func(_ context.Context, _ driver.Executor, ev idem.Event) error {
			if ev.AggregateID == bad.Load().(string) {
				return errors.New("bad event")
			}
			return nil
		})
		evs := make([]idem.Event, 10)
		for i := range evs {
			evs[i] = placed(t, fmt.Sprint(i))
		}
		o, err := c.Process(ctx, evs[0])
		must(t, o, err, inbox.Applied)
		batch := append(append([]idem.Event{}, evs...), evs[3])
		bad.Store("5")
		res := c.ProcessBatch(ctx, batch)
		for i, r := range res {
			want := inbox.Applied
			switch i {
			case 0, 10:
				want = inbox.Duplicate
			case 5:
				want = inbox.Failed
			}
			if r.Outcome != want {
				t.Errorf("result %d = %v (%v), want %v", i, r.Outcome, r.Err, want)
			}
		}
		if n := db.count(t, "reservation"); n != 9 {
			t.Errorf("reservations = %d, want 9 (all but the failing one)", n)
		}
		if n := db.count(t, "processed_event"); n != 9 {
			t.Errorf("markers = %d, want 9", n)
		}
		bad.Store("")
		res = c.ProcessBatch(ctx, evs)
		for i, r := range res {
			want := inbox.Duplicate
			if i == 5 {
				want = inbox.Applied
			}
			if r.Outcome != want || r.Err != nil {
				t.Errorf("second batch result %d = %v (%v), want %v", i, r.Outcome, r.Err, want)
			}
		}
	})
}

// concurrentDelivery holds a first worker inside its handler, starts a
// second delivery of the same event, waits until it blocks on the first
// one's marker (where locks can be observed), then lets the first commit or
// roll back: exactly one applies.
func concurrentDelivery[TTx any](t *testing.T, setup Setup[TTx], firstCommits bool) {
	db := setup.open(t, Options{})
	db.exec(t, reservationTable)
	ctx := testsvc.Ctx(t, time.Minute)
	entered := make(chan int64, 1)
	release := make(chan struct{})
	var calls atomic.Int32
	c := consumer(t, db, "stock", func(ctx context.Context, ex driver.Executor, ev idem.Event) error {
		if calls.Add(1) > 1 {
			return nil
		}
		var session int64
		if !db.Features.SingleWriter {
			var err error
			if session, err = db.Session(ctx, ex); err != nil {
				return err
			}
		}
		entered <- session
		<-release
		if !firstCommits {
			return errors.New("first worker fails")
		}
		return nil
	})
	ev := placed(t, "42")
	type res struct {
		o   inbox.Outcome
		err error
	}
	first, second := make(chan res, 1), make(chan res, 1)
	go func() { o, err := c.Process(ctx, ev); first <- res{o, err} }()
	session := <-entered
	go func() { o, err := c.Process(ctx, ev); second <- res{o, err} }()
	if !db.Features.SingleWriter {
		deadline := time.Now().Add(20 * time.Second)
		for {
			blocked, err := db.Blocking(ctx, session)
			fatalIf(t, err, "observe locks")
			if blocked {
				break
			}
			select {
			case r := <-second:
				t.Fatalf("second worker finished (%v, %v) while the first still held the event", r.o, r.err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("second worker never waited for the first one's marker")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	close(release)
	r1, r2 := <-first, <-second
	if firstCommits {
		must(t, r1.o, r1.err, inbox.Applied)
		must(t, r2.o, r2.err, inbox.Duplicate)
	} else {
		if r1.o != inbox.Failed {
			t.Fatalf("first = %v, %v; want Failed", r1.o, r1.err)
		}
		must(t, r2.o, r2.err, inbox.Applied)
	}
	if n := db.count(t, "reservation WHERE order_id = '42'"); n != 1 {
		t.Errorf("reservations = %d, want exactly 1", n)
	}
	if n := db.count(t, "processed_event"); n != 1 {
		t.Errorf("processed_event rows = %d, want 1", n)
	}
}

// FailureStore checks save (and save again with the entry's id: one entry,
// history appended, the message as first stored), list with filters, get,
// and remove.
func FailureStore[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	fs := inbox.NewFailureStore(db.Driver)
	evID := idem.NewEventID()
	body := []byte{'{', 0x00, 0xff, 0xfe, '}'}
	msg := idem.FailedMessage{
		Consumer: "stock", Source: "stock.events", EventID: evID, EventName: "order.order.placed.v1",
		Key: []byte("42"), Headers: map[string]string{"x-attempt": "3", "é": "ü"}, Body: body,
		Error: "first failure", Attempts: 3,
	}
	id, err := fs.Save(ctx, msg)
	fatalIf(t, err, "save")
	again := msg
	again.ID, again.Error, again.Attempts = id, "second failure", 2
	again.Source, again.EventName, again.Key = "other.events", "order.order.other.v1", []byte("43")
	again.Headers, again.Body = map[string]string{idem.HeaderRedrive: fmt.Sprint(id)}, []byte("other body")
	id2, err := fs.Save(ctx, again)
	fatalIf(t, err, "save again")
	if id2 != id {
		t.Errorf("saving again with the entry's id made entry %d, want %d updated", id2, id)
	}
	other, err := fs.Save(ctx, idem.FailedMessage{Consumer: "billing", Body: []byte("not json"), Error: "undecodable", Attempts: 1})
	fatalIf(t, err, "save undecodable")
	if other == id {
		t.Fatal("a message without event id reused an entry")
	}
	third, err := fs.Save(ctx, idem.FailedMessage{Consumer: "billing", Body: []byte("still not json"), Error: "undecodable", Attempts: 1})
	fatalIf(t, err, "save a second undecodable")
	if third == other {
		t.Fatal("two messages without event id share an entry")
	}

	got, err := fs.Get(ctx, id)
	fatalIf(t, err, "get")
	if got.Consumer != "stock" || got.Source != "stock.events" || got.EventID != evID || got.EventName != msg.EventName ||
		!bytes.Equal(got.Key, []byte("42")) || !bytes.Equal(got.Body, body) || got.Error != "second failure" || got.Attempts != 5 {
		t.Errorf("entry = %+v", got)
	}
	if got.Headers["x-attempt"] != "3" || got.Headers["é"] != "ü" {
		t.Errorf("headers = %v", got.Headers)
	}
	if len(got.History) != 2 || got.History[0].Error != "first failure" || got.History[1].Error != "second failure" || got.History[1].Attempt != 2 {
		t.Errorf("history = %+v, want both failures in order", got.History)
	}
	if got.FirstFailed.IsZero() || got.LastFailed.Before(got.FirstFailed) {
		t.Errorf("first/last failed = %v / %v", got.FirstFailed, got.LastFailed)
	}
	if time.Since(got.LastFailed).Abs() > time.Hour {
		t.Errorf("last failed = %v, want about now (UTC)", got.LastFailed)
	}

	all, err := fs.List(ctx, idem.FailedFilter{})
	fatalIf(t, err, "list")
	if len(all) != 3 {
		t.Errorf("list = %d entries, want 3", len(all))
	}
	billing, err := fs.List(ctx, idem.FailedFilter{Consumer: "billing", Limit: 1})
	fatalIf(t, err, "list billing")
	if len(billing) != 1 || billing[0].Consumer != "billing" || billing[0].EventID != uuid.Nil {
		t.Errorf("billing list = %+v, want one entry", billing)
	}
	byName, err := fs.List(ctx, idem.FailedFilter{EventName: "order.order.placed.v1"})
	fatalIf(t, err, "list by name")
	if len(byName) != 1 || byName[0].ID != id {
		t.Errorf("list by event name = %d entries, want entry %d", len(byName), id)
	}
	future, err := fs.List(ctx, idem.FailedFilter{Since: time.Now().Add(time.Hour)})
	fatalIf(t, err, "list since")
	if len(future) != 0 {
		t.Errorf("list since the future = %d entries, want 0", len(future))
	}
	recent, err := fs.List(ctx, inbox.FailedSince(time.Hour))
	fatalIf(t, err, "list recent")
	if len(recent) != 3 {
		t.Errorf("list of the last hour = %d entries, want 3", len(recent))
	}

	ok, err := fs.Remove(ctx, id)
	fatalIf(t, err, "remove")
	if !ok {
		t.Error("remove reported no entry")
	}
	if ok, _ := fs.Remove(ctx, id); ok {
		t.Error("second remove reported an entry")
	}
	if _, err := fs.Get(ctx, id); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("get removed entry: err = %v, want ErrNotFound", err)
	}
}

// Purge checks batches, the consumer filter and the replay-window check,
// for markers and attempt counts.
func Purge[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	now := time.Now()
	// 25 old markers of stock, 5 old of billing, 3 recent of stock.
	for i := range 33 {
		consumer, age := "stock", 40*24*time.Hour
		switch {
		case i >= 30:
			age = time.Hour
		case i >= 25:
			consumer = "billing"
		}
		db.exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at) VALUES (?, ?, ?)`,
			consumer, idem.NewEventID().String(), db.timeArg(now.Add(-age)))
	}
	// Attempt counts: 4 old of stock, 1 recent of stock, 1 old of billing.
	for i := range 6 {
		consumer, age := "stock", 40*24*time.Hour
		switch i {
		case 4:
			age = time.Hour
		case 5:
			consumer = "billing"
		}
		at := db.timeArg(now.Add(-age))
		db.exec(t, `INSERT INTO delivery_attempt (consumer_name, event_id, attempts, last_error, first_failed_at, last_failed_at) VALUES (?, ?, 2, 'boom', ?, ?)`,
			consumer, idem.NewEventID().String(), at, at)
	}
	_, err := inbox.Purge(ctx, db.Driver, inbox.PurgeConfig{Horizon: 7 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour})
	if !errors.Is(err, inbox.ErrHorizonTooShort) {
		t.Fatalf("purge with a horizon under the replay window: err = %v, want ErrHorizonTooShort", err)
	}
	if n := db.count(t, "processed_event"); n != 33 {
		t.Fatalf("refused purge deleted rows: %d left, want 33", n)
	}
	if _, err := inbox.Purge(ctx, db.Driver, inbox.PurgeConfig{Horizon: 7 * 24 * time.Hour}); err == nil {
		t.Fatal("purge without a replay window: want an error")
	}
	var progress []inbox.PurgeResult
	res, err := inbox.Purge(ctx, db.Driver, inbox.PurgeConfig{
		Consumer: "stock", Horizon: 31 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour, BatchSize: 10,
		Now: func() time.Time { return now }, Progress: func(r inbox.PurgeResult) { progress = append(progress, r) },
	})
	fatalIf(t, err, "purge")
	if res.Deleted != 25 || res.Batches != 3 || res.Attempts != 4 {
		t.Errorf("result = %+v, want 25 markers deleted in 3 batches of at most 10, and 4 attempt counts", res)
	}
	// Told after each statement: three of markers, one of attempt counts.
	if len(progress) != 4 || progress[0].Deleted != 10 || progress[1].Deleted != 20 || progress[3] != res {
		t.Errorf("Progress told %+v, want the running result after each of the 4 statements, the last %+v", progress, res)
	}
	if n := db.count(t, "delivery_attempt"); n != 2 {
		t.Errorf("attempt counts left = %d, want 2 (recent, or not this consumer)", n)
	}
	if n := db.count(t, "processed_event WHERE consumer_name = 'stock'"); n != 3 {
		t.Errorf("stock markers left = %d, want the 3 recent ones", n)
	}
	if n := db.count(t, "processed_event WHERE consumer_name = 'billing'"); n != 5 {
		t.Errorf("billing markers left = %d, want 5 (not this consumer)", n)
	}
	res, err = inbox.Purge(ctx, db.Driver, inbox.PurgeConfig{Horizon: 31 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour})
	fatalIf(t, err, "purge all consumers")
	if res.Deleted != 5 {
		t.Errorf("purge of every consumer deleted %d, want the 5 billing markers", res.Deleted)
	}
}

// StateCopy checks versioned upserts (Dialect.UpsertVersioned through
// inbox.ApplyState), on a schema-qualified table name: 1, 3, 2 leaves 3,
// with the gap from 1 to 3 reported, and 2 stale with the stored version as
// Previous. Then the same in a consumer's handler, on the bare table name:
// events of versions 1, 3, 2 leave the state of version 3.
func StateCopy[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	db.exec(t, `CREATE TABLE order_status (order_id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(64) NOT NULL, version BIGINT NOT NULL)`)
	ctx := testsvc.Ctx(t, time.Minute)
	copyOf := inbox.StateCopy{Table: db.Schema + ".order_status", Key: "order_id", Columns: []string{"status"}}
	apply := func(version int64, status string) inbox.VersionResult {
		t.Helper()
		tx := db.begin(t, ctx)
		res, err := inbox.ApplyState(ctx, db.Driver, tx, copyOf, "42", version, status)
		fatalIf(t, err, "apply v%d", version)
		fatalIf(t, db.Driver.Commit(ctx, tx), "commit")
		return res
	}
	if r := apply(1, "confirmed"); !r.Applied || r.Previous != 0 || r.Gap {
		t.Errorf("v1 = %+v, want applied, no previous, no gap", r)
	}
	if r := apply(3, "cancelled"); !r.Applied || r.Previous != 1 || !r.Gap {
		t.Errorf("v3 after v1 = %+v, want applied with a gap from 1", r)
	}
	if r := apply(2, "in preparation"); r.Applied || !r.Stale() || r.Previous != 3 {
		t.Errorf("late v2 = %+v, want stale with the stored version 3 as Previous", r)
	}
	if r := apply(3, "cancelled"); r.Applied || r.Previous != 3 {
		t.Errorf("same version again = %+v, want stale with Previous 3", r)
	}
	var (
		status  string
		version int64
	)
	db.queryRow(t, `SELECT status, version FROM order_status WHERE order_id = '42'`, nil, &status, &version)
	if version != 3 || status != "cancelled" {
		t.Errorf("state = %q v%d, want cancelled v3", status, version)
	}
	if r := apply(4, "shipped"); !r.Applied || r.Gap || r.Previous != 3 {
		t.Errorf("v4 = %+v, want applied without gap", r)
	}

	// In a handler, through the consumer's driver.
	c, err := inbox.New(db.Driver, inbox.Config{Name: "shipping", Logger: testlog.New(t)})
	fatalIf(t, err, "new consumer")
	byHandler := inbox.StateCopy{Table: "order_status", Key: "order_id", Columns: []string{"status"}}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx TTx, ev idem.Event) error {
		_, err := inbox.ApplyState(ctx, c.Driver(), tx, byHandler, ev.AggregateID, ev.AggregateVersion, ev.Name)
		return err
	})
	for _, v := range []int{1, 3, 2} {
		ev := changed(t, "43", v)
		ev.Name = []string{"", "order.order.placed.v1", "order.order.paid.v1", "order.order.cancelled.v1"}[v]
		o, err := c.Process(ctx, ev)
		must(t, o, err, inbox.Applied)
	}
	db.queryRow(t, `SELECT status, version FROM order_status WHERE order_id = '43'`, nil, &status, &version)
	if version != 3 || status != "order.order.cancelled.v1" {
		t.Errorf("state after events 1, 3, 2 = %q v%d, want the state of v3", status, version)
	}
}
