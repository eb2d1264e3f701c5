package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/relay"
)

func TestRelayPublishesEnvelopes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event(t, "42", 3)
	ev.Headers = map[string]string{"trace": "abc"}
	b.insert(t, ev)
	// A row written by another program with Debezium's five columns only.
	debeziumID := uuid.New()
	b.pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', '43', 'OrderCreated', '{"orderId": 43}')`, debeziumID)

	r := b.start(t, fastConfig(t))
	if err := b.pub.WaitLen(testsvc.Ctx(t, 10*time.Second), 2); err != nil {
		t.Fatal(err)
	}
	byID := map[uuid.UUID]idem.Event{}
	for _, m := range b.pub.Messages() {
		byID[m.EventID] = decode(t, m)
		if m.EventName == "" || string(m.Key) == "" || m.AggregateType != "order" {
			t.Errorf("message %s lacks routing fields: %+v", m.EventID, m)
		}
	}
	got := byID[ev.ID]
	if got.Name != ev.Name || got.AggregateID != "42" || got.AggregateVersion != 3 ||
		!got.OccurredAt.Equal(ev.OccurredAt.Truncate(time.Microsecond)) || got.Headers["trace"] != "abc" {
		t.Errorf("idem event published as %+v, want %+v", got, ev)
	}
	dbz, ok := byID[debeziumID]
	if !ok {
		t.Fatalf("the Debezium-style row was not published")
	}
	if dbz.Name != "OrderCreated" || dbz.AggregateID != "43" || dbz.AggregateVersion != 0 ||
		string(dbz.Payload) != `{"orderId":43}` || dbz.OccurredAt.IsZero() {
		t.Errorf("Debezium-style row published as %+v", dbz)
	}
	testsvc.WaitFor(t, 10*time.Second, "rows marked published", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0 && r.Stats().Published >= 2
	})
	if s := r.Stats(); s.Published != 2 {
		t.Errorf("Stats().Published = %d, want 2", s.Published)
	}
}

func TestRelayWakesOnNotify(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := fastConfig(t)
	cfg.PollInterval = time.Hour // only a notification can wake the relay
	b.start(t, cfg)
	for i := range 3 {
		b.insert(t, event(t, fmt.Sprint(i), 1))
		if err := b.pub.WaitLen(testsvc.Ctx(t, 5*time.Second), i+1); err != nil {
			t.Fatalf("event %d not published after its notification: %v", i, err)
		}
	}
}

// TestRelayClaimsOncePerWakeUp: a relay that keeps up with rows committed
// one at a time claims each once. Before it waits, the listener looks
// whether a claim could find rows rather than waking it to claim once more
// for nothing.
func TestRelayClaimsOncePerWakeUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := fastConfig(t)
	cfg.PollInterval = time.Hour // only a notification can wake the relay
	r := b.start(t, cfg)
	b.insert(t, event(t, "first", 1))
	if err := b.pub.WaitLen(testsvc.Ctx(t, 5*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	const events = 40
	base := r.Stats()
	for i := range events {
		b.insert(t, event(t, fmt.Sprint(i%3), i+1))
		if err := b.pub.WaitLen(testsvc.Ctx(t, 5*time.Second), i+2); err != nil {
			t.Fatalf("event %d not published after its notification: %v", i, err)
		}
	}
	s := r.Stats()
	// A commit's notification can still arrive after the claim that the
	// listener's check made for the same row (a few in ten under the race
	// detector); at least one empty claim per event is what a relay that
	// claims again after each batch does.
	if empty := s.EmptyClaims - base.EmptyClaims; empty > events/2 {
		t.Errorf("%d empty claims and %d claims with rows for %d events committed one at a time, want about one claim each",
			empty, s.Claims-base.Claims, events)
	}
}

// TestIdlePollsDoNotAskTheListenerAgain: an idle relay that polls and finds
// nothing does not ask the listener to look for rows again after each poll
// (its claim just looked): the listener is told once, and again only after
// something that its last look could miss (here a notification).
func TestIdlePollsDoNotAskTheListenerAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	drv := &countingWaitListener{PgxDriver: b.pg.Driver}
	claims := make(chan struct{}, 1000)
	cfg := fastConfig(t)
	cfg.PollInterval = 5 * time.Millisecond
	cfg.Observer.Claim = func(time.Duration) {
		select {
		case claims <- struct{}{}:
		default:
		}
	}
	r, err := relay.New[pgx.Tx](drv, b.pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	polls := func(n int) {
		t.Helper()
		ctx := testsvc.Ctx(t, 30*time.Second)
		for range n {
			select {
			case <-claims:
			case <-ctx.Done():
				t.Fatal("the relay stopped polling")
			}
		}
	}
	polls(50)
	if n := drv.reports.Load(); n > 3 {
		t.Fatalf("%d reports of idleness for 50 polls that found nothing, want the first only (and a spare)", n)
	}
	before := drv.reports.Load()
	b.insert(t, event(t, "1", 1)) // notifies: the listener held the lock
	if err := b.pub.WaitLen(testsvc.Ctx(t, 10*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	polls(50)
	if n := drv.reports.Load() - before; n < 1 || n > 3 {
		t.Fatalf("%d reports of idleness after a notification and 50 empty polls, want 1 (and a spare)", n)
	}
}

// countingWaitListener counts the relay's reports of idleness to its
// listener.
type countingWaitListener struct {
	*postgres.PgxDriver
	reports atomic.Int64
}

func (d *countingWaitListener) ListenOutboxWaiting(ctx context.Context, notify func(), idle <-chan struct{}) error {
	fwd := make(chan struct{}, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-idle:
				d.reports.Add(1)
				select {
				case fwd <- struct{}{}:
				default:
				}
			}
		}
	}()
	return d.PgxDriver.ListenOutboxWaiting(ctx, notify, fwd)
}

// TestRelayFreedFollowerWhileWaiting: a row committed behind a batch in
// flight cannot be claimed until that batch is marked. When it is, the
// relay finds the row although it already waits (it holds the wait lock, so
// that the row's insert may not notify again): the listener looks again at
// each batch's end.
func TestRelayFreedFollowerWhileWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := fastConfig(t)
	cfg.PollInterval = time.Hour                           // only a notification can wake the relay
	cfg.Lease, cfg.PublishTimeout = 3*time.Hour, time.Hour // the held call waits for the gate
	ctx := testsvc.Ctx(t, 20*time.Second)
	gate := make(chan struct{})
	b.pub.SetFunc(func(_ int, msgs []idem.Message) memory.Action {
		for _, m := range msgs {
			if string(m.Key) == "held" {
				return memory.Action{Hang: gate}
			}
		}
		return memory.Action{}
	})
	r := b.start(t, cfg)
	b.insert(t, event(t, "held", 1))
	if err := b.pub.Wait(ctx, func(_ []idem.Message, inflight int) bool { return inflight == 1 }); err != nil {
		t.Fatal(err)
	}
	b.insert(t, event(t, "held", 2)) // behind the batch in flight
	// Another row, then wake-ups until the worker without a batch in
	// flight has found nothing: the relay is idle and the listener holds
	// the wait lock.
	b.insert(t, event(t, "other", 1))
	r.Notify() // the relay is busy: the insert did not notify
	if err := b.pub.WaitLen(ctx, 1); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 10*time.Second, "the relay's wait lock", func() bool {
		held := b.pg.Count(t, "pg_locks WHERE locktype = 'advisory' AND classid = 7194 AND mode = 'ExclusiveLock' AND granted"+
			" AND objid::text::bigint = ('outbox'::regclass::oid::bigint + 2147483648) % 4294967296") == 1
		if !held {
			r.Notify()
		}
		return held
	})
	close(gate)
	if err := b.pub.WaitLen(ctx, 3); err != nil {
		t.Fatalf("the row behind the batch was not published once the batch was marked: %v", err)
	}
	if got := string(b.pub.Messages()[2].Key); got != "held" {
		t.Errorf("third message of aggregate %q, want held/2", got)
	}
}

// TestRelayPollsWithoutNotifications runs the relay as Config.DisableListen
// documents for writers that disable the notification trigger: the inserts
// send no notification, and the relay still publishes by polling.
func TestRelayPollsWithoutNotifications(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.pg.Exec(t, `ALTER TABLE outbox DISABLE TRIGGER outbox_notify`)
	ctx := testsvc.Ctx(t, 10*time.Second)
	conn, err := b.pg.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var channel string
	if err := conn.QueryRow(ctx, `SELECT current_schema() || '.outbox'`).Scan(&channel); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+postgres.QuoteIdent(channel)); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), `UNLISTEN *`) }()

	cfg := fastConfig(t)
	cfg.DisableListen = true
	cfg.PollInterval = 20 * time.Millisecond
	b.start(t, cfg)
	for i := range 3 {
		b.insert(t, event(t, fmt.Sprint(i), 1))
	}
	if err := b.pub.WaitLen(ctx, 3); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if n, err := conn.Conn().WaitForNotification(wctx); err == nil {
		t.Errorf("notification %q sent with the trigger disabled", n.Channel)
	}
}

// TestRelayWithoutListenPollsOftenAndCanBeNotified: a driver without
// LISTEN/NOTIFY (database/sql here; MySQL and SQLite always) polls every
// 50ms by default, and an in-process producer can wake the relay at once
// with Notify.
func TestRelayWithoutListenPollsOftenAndCanBeNotified(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sqlDrv := postgres.NewSQL(b.pg.DB)
	r, err := relay.New(sqlDrv, b.pub, relay.Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Config().PollInterval; got != relay.PollIntervalNoListenDefault {
		t.Fatalf("PollInterval without LISTEN = %v, want %v", got, relay.PollIntervalNoListenDefault)
	}
	if r, _ := relay.New(b.pg.Driver, b.pub, relay.Config{}); r.Config().PollInterval != relay.PollIntervalDefault {
		t.Fatalf("PollInterval with LISTEN = %v, want %v", r.Config().PollInterval, relay.PollIntervalDefault)
	}

	cfg := fastConfig(t)
	cfg.Workers = 1
	cfg.PollInterval = time.Hour // after its first claim, only Notify can wake it
	b.insert(t, event(t, "1", 1))
	r, err = relay.New(sqlDrv, b.pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	if err := b.pub.WaitLen(testsvc.Ctx(t, 5*time.Second), 1); err != nil {
		t.Fatalf("first event not published by the start-up claim: %v", err)
	}
	b.insert(t, event(t, "2", 1))
	r.Notify()
	if err := b.pub.WaitLen(testsvc.Ctx(t, 5*time.Second), 2); err != nil {
		t.Fatalf("event not published after Notify: %v", err)
	}
}

// TestRelayOrderManyWorkers: 4 workers, 1,000 aggregates x 20 events written
// by concurrent transactions, some of them long-running: every event is
// published once, each aggregate's events in order.
func TestRelayOrderManyWorkers(t *testing.T) {
	t.Parallel()
	const (
		aggregates = 1000
		perAgg     = 20
		writers    = 16
		perTx      = 8
	)
	b := setup(t)
	cfg := fastConfig(t)
	cfg.Workers = 4
	cfg.BatchSize = 200
	cfg.MaxPerAggregate = 5
	r := b.start(t, cfg)

	ctx := testsvc.Ctx(t, 3*time.Minute)
	var wg sync.WaitGroup
	var longTx atomic.Int64
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			// Each writer owns the aggregates w, w+writers, ... and writes
			// their events version by version, each transaction holding
			// the next event of a few aggregates.
			var mine []string
			for a := w; a < aggregates; a += writers {
				mine = append(mine, fmt.Sprint(a))
			}
			for v := 1; v <= perAgg; v++ {
				for i := 0; i < len(mine); i += perTx {
					long := (w+v+i)%23 == 0
					if err := b.writeEvents(ctx, mine[i:min(i+perTx, len(mine))], v, long, &longTx); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if longTx.Load() == 0 {
		t.Fatal("no long-running transaction committed after later rows were published")
	}
	if err := b.pub.WaitLen(ctx, aggregates*perAgg); err != nil {
		t.Fatalf("published %d of %d: %v", b.pub.Len(), aggregates*perAgg, err)
	}
	testsvc.WaitFor(t, time.Minute, "every row marked", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	msgs := b.pub.Messages()
	if len(msgs) != aggregates*perAgg {
		t.Errorf("published %d messages, want %d (no duplicates without a crash)", len(msgs), aggregates*perAgg)
	}
	last := map[string]int64{}
	for _, m := range msgs {
		ev := decode(t, m)
		if want := last[ev.AggregateID] + 1; ev.AggregateVersion != want {
			t.Fatalf("aggregate %s: published version %d after %d", ev.AggregateID, ev.AggregateVersion, want-1)
		}
		last[ev.AggregateID] = ev.AggregateVersion
	}
	if s := r.Stats(); s.LeasesLost != 0 || s.Takeovers != 0 {
		t.Errorf("unexpected lease trouble: %+v", s)
	}
}

// writeEvents commits the version-th event of each of aggs in one
// transaction. A long transaction inserts its rows (taking seqs), then stays
// open until more events were published, so that its rows commit after rows
// with higher seqs went out.
func (b *bundle) writeEvents(ctx context.Context, aggs []string, version int, long bool, longTx *atomic.Int64) error {
	tx, err := b.pg.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, agg := range aggs {
		ev, err := idem.NewEvent("order.order.changed.v1", "order", agg, map[string]any{"version": version})
		if err != nil {
			return err
		}
		ev.AggregateVersion = int64(version)
		if err := b.w.Add(ctx, tx, ev); err != nil {
			return err
		}
	}
	if long {
		before := b.pub.Len()
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := b.pub.WaitLen(wctx, before+50)
		cancel()
		if err == nil {
			longTx.Add(1)
		}
	}
	return tx.Commit(ctx)
}

// TestRelayLateCommitIsNotSkipped: a row with a lower seq committed after
// later rows were published is published too.
func TestRelayLateCommitIsNotSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testsvc.Ctx(t, 30*time.Second)
	tx, err := b.pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	late := event(t, "late", 1)
	if err := b.w.Add(ctx, tx, late); err != nil {
		t.Fatal(err)
	}
	b.start(t, fastConfig(t))
	for i := range 10 {
		b.insert(t, event(t, fmt.Sprint(i), 1))
	}
	if err := b.pub.WaitLen(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.pub.WaitLen(ctx, 11); err != nil {
		t.Fatal(err)
	}
	if got := b.pub.Messages()[10].EventID; got != late.ID {
		t.Errorf("11th message is %s, want the late row %s", got, late.ID)
	}
}

func TestRelayBrokerUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.pub.Fail(errors.New("broker down"))
	cfg := fastConfig(t)
	cfg.StatsInterval = 20 * time.Millisecond
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	start := time.Now()
	r := b.start(t, cfg)

	var all []idem.Event
	for round := range 5 {
		var evs []idem.Event
		for a := range 40 {
			evs = append(evs, event(t, fmt.Sprint(a), round+1))
		}
		b.insert(t, evs...)
		all = append(all, evs...)
	}
	testsvc.WaitFor(t, 10*time.Second, "failures recorded", func() bool {
		return b.pg.Count(t, "outbox WHERE last_error LIKE '%broker down%'") > 0 && b.pub.Calls() >= 3
	})
	// A broker away costs time, never attempts: nothing nears quarantine.
	if n := b.pg.Count(t, "outbox WHERE attempts > 0 OR quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows charged an attempt or quarantined while the broker was down", n)
	}
	testsvc.WaitFor(t, 10*time.Second, "backlog measured", func() bool {
		s := r.Stats()
		return s.Backlog == int64(len(all)) && !s.OldestUnpublished.IsZero()
	})
	if n := b.pg.Count(t, "outbox WHERE published_at IS NULL"); n != len(all) {
		t.Fatalf("%d unpublished rows while the broker is down, want %d", n, len(all))
	}
	if b.pub.Len() != 0 {
		t.Fatalf("%d messages accepted by a broker that is down", b.pub.Len())
	}

	b.pub.Recover()
	testsvc.WaitFor(t, 30*time.Second, "backlog drained", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	got := countIDs(idsOf(b.pub.Messages()))
	for _, ev := range all {
		if got[ev.ID] != 1 {
			t.Errorf("event %s published %d times", ev.ID, got[ev.ID])
		}
	}
	checkOrder(t, b.pub.Messages())
	if s := r.Stats(); s.PublishErrors == 0 {
		t.Errorf("Stats().PublishErrors = 0 after failures")
	}

	// The outage is in the log once, then as a count once per interval,
	// then one line when publications succeed again.
	testsvc.WaitFor(t, 10*time.Second, "recovery logged", func() bool {
		return strings.Contains(logs.String(), `msg="relay publications recovered"`)
	})
	elapsed := time.Since(start)
	text := logs.String()
	if n, most := strings.Count(text, `msg="broker failed; pausing"`), 1+int(elapsed/errlog.IntervalDefault); n == 0 || n > most {
		t.Errorf("%d lines for the broker's failures in %v, want 1 to %d:\n%s", n, elapsed.Round(time.Millisecond), most, text)
	}
	if n := strings.Count(text, "recovered"); n != 1 {
		t.Errorf("%d recovered lines, want 1:\n%s", n, text)
	}
}

// checkOrder fails the test if an aggregate's versions are published out of
// order, looking at each event's first delivery: what a deduplicating
// consumer applies.
func checkOrder(t *testing.T, msgs []idem.Message) {
	t.Helper()
	last := map[string]int64{}
	seen := map[uuid.UUID]bool{}
	for _, m := range msgs {
		if seen[m.EventID] {
			continue
		}
		seen[m.EventID] = true
		ev := decode(t, m)
		if ev.AggregateVersion < last[ev.AggregateID] {
			t.Fatalf("aggregate %s: version %d published after %d", ev.AggregateID, ev.AggregateVersion, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.AggregateVersion
	}
}

// TestRelayRefusedRowDoesNotBlockOthers: a row the broker keeps refusing is
// retried with its attempts and last error recorded (here never quarantined:
// Config.QuarantineAfter is negative); the rest of its aggregate waits, other
// aggregates go on.
func TestRelayRefusedRowDoesNotBlockOthers(t *testing.T) {
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
	b.insert(t, bad, event(t, "bad", 2))
	var good []idem.Event
	for a := range 20 {
		for v := 1; v <= 3; v++ {
			good = append(good, event(t, fmt.Sprint(a), v))
		}
	}
	b.insert(t, good...)
	cfg := fastConfig(t)
	cfg.QuarantineAfter = -1
	b.start(t, cfg)
	if err := b.pub.WaitLen(testsvc.Ctx(t, 10*time.Second), len(good)); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 10*time.Second, "retries recorded", func() bool {
		return b.pg.Count(t, "outbox WHERE id = $1 AND attempts >= 12 AND last_error = 'message too large'", bad.ID) == 1
	})
	if n := b.pg.Count(t, "outbox WHERE quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows quarantined with a negative QuarantineAfter", n)
	}
	for _, m := range b.pub.Messages() {
		if string(m.Key) == "bad" {
			t.Errorf("published %s of the blocked aggregate", m.EventID)
		}
	}
	if n := b.pg.Count(t, "outbox WHERE aggregateid = 'bad' AND published_at IS NULL"); n != 2 {
		t.Errorf("%d unpublished rows for the refused aggregate, want 2", n)
	}
	checkOrder(t, b.pub.Messages())

	// Once the broker accepts it, the aggregate goes on in order.
	b.pub.SetFunc(nil)
	testsvc.WaitFor(t, 10*time.Second, "the refused aggregate published", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	msgs := b.pub.Messages()
	if decode(t, msgs[len(msgs)-2]).AggregateVersion != 1 || decode(t, msgs[len(msgs)-1]).AggregateVersion != 2 {
		t.Errorf("refused aggregate published out of order")
	}
}

// TestRelayLostConfirm: the broker takes the messages but the relay hears a
// failure; the rows are published again and nothing is lost.
func TestRelayLostConfirm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.pub.SetFunc(func(call int, _ []idem.Message) memory.Action {
		return memory.Action{LoseConfirm: call == 1}
	})
	var evs []idem.Event
	for a := range 10 {
		evs = append(evs, event(t, fmt.Sprint(a), 1))
	}
	b.insert(t, evs...)
	b.start(t, fastConfig(t))
	testsvc.WaitFor(t, 10*time.Second, "rows published", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	got := countIDs(idsOf(b.pub.Messages()))
	for _, ev := range evs {
		if got[ev.ID] != 2 {
			t.Errorf("event %s accepted %d times, want 2 (lost confirm, then retry)", ev.ID, got[ev.ID])
		}
	}
}

// TestRelayStalledWorkerCannotMark: a worker paused past its lease (here in
// the middle of a Publish call that ignores its deadline) finds its rows
// taken over and published by another worker; when it resumes it marks and
// releases nothing.
func TestRelayStalledWorkerCannotMark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var evs []idem.Event
	for a := range 5 {
		evs = append(evs, event(t, fmt.Sprint(a), 1), event(t, fmt.Sprint(a), 2))
	}
	b.insert(t, evs...)

	resume := make(chan struct{})
	stalled := make(chan struct{})
	var once sync.Once
	stalledPub := memory.New()
	stalledPub.SetFunc(func(int, []idem.Message) memory.Action {
		once.Do(func() { close(stalled) })
		return memory.Action{Hang: resume, IgnoreContext: true}
	})
	cfgA := fastConfig(t)
	cfgA.Workers = 1
	cfgA.Lease = time.Second
	cfgA.PublishTimeout = 100 * time.Millisecond
	a := startRelay(t, b.pg, stalledPub, cfgA)
	select {
	case <-stalled:
	case <-testsvc.Ctx(t, 10*time.Second).Done():
		t.Fatal("relay A never published")
	}

	cfgB := fastConfig(t)
	cfgB.Workers = 1
	rb := b.start(t, cfgB)
	testsvc.WaitFor(t, 10*time.Second, "relay B published everything", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	if got := b.pub.Len(); got != len(evs) {
		t.Fatalf("relay B published %d messages, want %d", got, len(evs))
	}
	if rb.Stats().Takeovers == 0 {
		t.Errorf("relay B reports no takeover")
	}
	var before []time.Time
	rows, err := b.pg.Pool.Query(context.Background(), "SELECT published_at FROM outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			t.Fatal(err)
		}
		before = append(before, at)
	}
	rows.Close()

	// Resume A: its publish "succeeds", its mark must change nothing.
	statsA := a.Stats()
	close(resume)
	testsvc.WaitFor(t, 10*time.Second, "relay A gave up its rows", func() bool {
		return a.Stats().LeasesLost > 0
	})
	rows, err = b.pg.Pool.Query(context.Background(), "SELECT published_at FROM outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for i := 0; rows.Next(); i++ {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			t.Fatal(err)
		}
		if !at.Equal(before[i]) {
			t.Errorf("row %d: published_at changed from %v to %v by the stalled worker", i, before[i], at)
		}
	}
	if s := a.Stats(); s.Published != 0 || s.Released != statsA.Released {
		t.Errorf("stalled relay marked %d and released %d rows it no longer owned", s.Published, s.Released-statsA.Released)
	}
}

// TestClaimFencing checks the fencing of the dialect directly: after a
// takeover, the first owner can neither mark nor release.
func TestClaimFencing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, event(t, "1", 1), event(t, "1", 2), event(t, "2", 1))
	d := b.pg.Driver.Dialect()
	ctx := testsvc.Ctx(t, 30*time.Second)
	claim := func(owner uuid.UUID, lease time.Duration) []driver.ClaimedRow {
		tx, err := b.pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		rows, err := d.ClaimOutbox(ctx, postgres.PgxExecutor{Q: tx}, driver.ClaimParams{Owner: owner, Lease: lease, Limit: 10, MaxPerAggregate: 10})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return rows
	}
	first, second := uuid.New(), uuid.New()
	rowsA := claim(first, 500*time.Millisecond)
	if len(rowsA) != 3 {
		t.Fatalf("first claim got %d rows, want 3", len(rowsA))
	}
	if again := claim(second, time.Minute); len(again) != 0 {
		t.Fatalf("claimed %d leased rows", len(again))
	}
	testsvc.WaitFor(t, 5*time.Second, "lease expiry", func() bool {
		return b.pg.Count(t, "outbox WHERE lease_until < now()") == 3
	})
	rowsB := claim(second, time.Minute)
	if len(rowsB) != 3 || !rowsB[0].TakenOver {
		t.Fatalf("takeover claimed %d rows (taken over: %v), want 3", len(rowsB), len(rowsB) > 0 && rowsB[0].TakenOver)
	}
	seqs := []int64{rowsA[0].Seq, rowsA[1].Seq, rowsA[2].Seq}
	pool := b.pg.Driver.Pool()
	if n, err := d.MarkPublished(ctx, pool, first, seqs); err != nil || n != 0 {
		t.Fatalf("stale owner marked %d rows (err %v)", n, err)
	}
	if n, err := d.ReleaseOutbox(ctx, pool, first, []driver.ReleaseRow{{Seq: seqs[0], Error: "x", Delay: time.Hour}}); err != nil || n != 0 {
		t.Fatalf("stale owner released %d rows (err %v)", n, err)
	}
	if n, err := d.MarkPublished(ctx, pool, second, seqs); err != nil || n != 3 {
		t.Fatalf("owner marked %d rows (err %v), want 3", n, err)
	}
}

// TestRelayStopReleasesInFlight: Stop with a deadline cancels a hanging
// publish and releases its rows without counting an attempt.
func TestRelayStopReleasesInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hang := make(chan struct{})
	defer close(hang)
	b.pub.SetFunc(func(int, []idem.Message) memory.Action { return memory.Action{Hang: hang} })
	b.insert(t, event(t, "1", 1), event(t, "2", 1))
	cfg := fastConfig(t)
	cfg.PublishTimeout = 4 * time.Second
	r, err := relay.New(b.pg.Driver, b.pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.pub.Wait(testsvc.Ctx(t, 10*time.Second), func(_ []idem.Message, inflight int) bool { return inflight > 0 }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want the deadline error", err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop = %v", err)
	}
	if n := b.pg.Count(t, "outbox WHERE lease_owner IS NOT NULL OR lease_until IS NOT NULL OR attempts > 0"); n != 0 {
		t.Errorf("%d rows still leased or charged an attempt after Stop", n)
	}
	if r.Healthy() == nil {
		t.Errorf("stopped relay reports healthy")
	}
}

// TestRelayGracefulStop: Stop without a deadline lets the in-flight batch
// finish and mark its rows.
func TestRelayGracefulStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	b.pub.SetFunc(func(int, []idem.Message) memory.Action { return memory.Action{Hang: release} })
	b.insert(t, event(t, "1", 1))
	r, err := relay.New(b.pg.Driver, b.pub, fastConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.pub.Wait(testsvc.Ctx(t, 10*time.Second), func(_ []idem.Message, inflight int) bool { return inflight > 0 }); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(context.Background()) }()
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if n := b.pg.Count(t, "outbox WHERE published_at IS NOT NULL"); n != 1 {
		t.Errorf("in-flight row not marked after a graceful stop")
	}
}

func TestRelayRetentionDeletesPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var evs []idem.Event
	for a := range 25 {
		evs = append(evs, event(t, fmt.Sprint(a), 1))
	}
	b.insert(t, evs...)
	cfg := fastConfig(t)
	cfg.Retention = time.Nanosecond
	cfg.RetentionInterval = 20 * time.Millisecond
	cfg.DeleteBatchSize = 10
	r := b.start(t, cfg)
	// The stats counter moves just after the DELETE commits, so wait for
	// both rather than reading the counter the moment the table is empty.
	testsvc.WaitFor(t, 10*time.Second, "published rows deleted", func() bool {
		return b.pg.Count(t, "outbox") == 0 && r.Stats().Deleted == int64(len(evs))
	})
	if b.pub.Len() != len(evs) || r.Stats().Deleted != int64(len(evs)) {
		t.Errorf("published %d, deleted %d; want %d", b.pub.Len(), r.Stats().Deleted, len(evs))
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := relay.New(b.pg.Driver, b.pub, relay.Config{Lease: time.Second, PublishTimeout: 2 * time.Second})
	if err == nil {
		t.Fatal("New accepted a PublishTimeout longer than the Lease")
	}
	if want := "Config.PublishTimeout"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %s", err, want)
	}
	if _, err := relay.New(b.pg.Driver, b.pub, relay.Config{Workers: -1}); err == nil || !strings.Contains(err.Error(), "Config.Workers") {
		t.Errorf("New(Workers: -1) = %v", err)
	}
}

func TestReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	var evs []idem.Event
	for h := range 6 {
		for a := range 3 {
			ev := event(t, fmt.Sprint(a), h+1)
			ev.OccurredAt = base.Add(time.Duration(h) * time.Hour)
			if a == 2 {
				ev.Name = "order.order.cancelled.v1"
			}
			evs = append(evs, ev)
		}
	}
	b.insert(t, evs...)
	b.start(t, fastConfig(t))
	testsvc.WaitFor(t, 10*time.Second, "everything published", func() bool {
		return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
	})
	b.pub.Reset()

	f := relay.ReplayFilter{Since: base.Add(2 * time.Hour), Until: base.Add(4 * time.Hour)}
	counts, err := relay.ReplayCounts(context.Background(), b.pg.Driver, f)
	if err != nil {
		t.Fatal(err)
	}
	if counts["order.order.changed.v1"] != 4 || counts["order.order.cancelled.v1"] != 2 || len(counts) != 2 {
		t.Errorf("ReplayCounts = %v", counts)
	}
	replayPub := memory.New()
	n, err := relay.Replay(context.Background(), b.pg.Driver, replayPub, f, relay.ReplayOptions{BatchSize: 4})
	if err != nil || n != 6 {
		t.Fatalf("Replay = %d, %v; want 6", n, err)
	}
	var want []uuid.UUID
	for _, ev := range evs {
		if !ev.OccurredAt.Before(f.Since) && ev.OccurredAt.Before(f.Until) {
			want = append(want, ev.ID)
		}
	}
	got := countIDs(idsOf(replayPub.Messages()))
	if len(got) != len(want) {
		t.Errorf("replayed %d distinct events, want %d", len(got), len(want))
	}
	for _, id := range want {
		if got[id] != 1 {
			t.Errorf("event %s replayed %d times", id, got[id])
		}
	}
	checkOrder(t, replayPub.Messages())

	f.EventName = "order.order.cancelled.v1"
	if n, err := relay.Replay(context.Background(), b.pg.Driver, replayPub, f, relay.ReplayOptions{}); err != nil || n != 2 {
		t.Errorf("Replay with an event name = %d, %v; want 2", n, err)
	}
}

// TestReplayAcrossAMove: an aggregate whose events of the period are partly
// in the outbox (published by the polling relay) and partly in the CDC
// relays' archive is replayed in order, whichever relay came first.
func TestReplayAcrossAMove(t *testing.T) {
	t.Parallel()
	for _, archiveFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("archive-first=%v", archiveFirst), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			base := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
			var evs []idem.Event
			for v := range 8 {
				ev := event(t, fmt.Sprint(v%2), v/2+1)
				ev.OccurredAt = base.Add(time.Duration(v) * time.Minute)
				evs = append(evs, ev)
			}
			older, newer := evs[:4], evs[4:]
			archived, polled := newer, older
			if archiveFirst {
				archived, polled = older, newer
			}
			// The archive's events published an hour ago when they came
			// first, in an hour otherwise: the outbox's rows are written
			// and published now.
			at := time.Now().Add(time.Hour)
			if archiveFirst {
				at = time.Now().Add(-time.Hour)
			}
			for _, ev := range archived {
				b.pg.Exec(t, `INSERT INTO outbox_archive (outbox_table, id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, published_at)
VALUES ('outbox', $1, $2, $3, $4, $5, $6, $7, $8)`, ev.ID.String(), ev.AggregateType, ev.AggregateID, ev.Name, string(ev.Payload), ev.OccurredAt, ev.AggregateVersion, at)
			}
			b.insert(t, polled...)
			b.start(t, fastConfig(t))
			testsvc.WaitFor(t, 10*time.Second, "the outbox's rows published", func() bool {
				return b.pg.Count(t, "outbox WHERE published_at IS NULL") == 0
			})
			replayed := memory.New()
			n, err := relay.Replay(context.Background(), b.pg.Driver, replayed, relay.ReplayFilter{Since: base}, relay.ReplayOptions{})
			if err != nil || n != 8 {
				t.Fatalf("Replay = %d, %v; want 8", n, err)
			}
			last := map[string]int64{}
			for _, m := range replayed.Messages() {
				ev := decode(t, m)
				if ev.AggregateVersion != last[ev.AggregateID]+1 {
					t.Errorf("aggregate %s: version %d replayed after %d", ev.AggregateID, ev.AggregateVersion, last[ev.AggregateID])
				}
				last[ev.AggregateID] = ev.AggregateVersion
			}
		})
	}
}
