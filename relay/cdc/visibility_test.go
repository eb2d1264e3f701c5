package cdc_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/cdc"
)

// businessTable is the producer's own table in these tests: each
// transaction that writes an event writes a row of it, which a consumer of
// the event expects to find.
const businessTable = `CREATE TABLE business (event_id uuid PRIMARY KEY)`

// readingPublisher stands for a consumer that reads the producer's
// database when an event arrives: before each Publish call, it looks for
// the business rows of the events, in a session of its own, and records
// the events whose row it cannot see. Then it publishes to a memory
// publisher.
type readingPublisher struct {
	*memory.Publisher
	pool *pgxpool.Pool

	mu      sync.Mutex
	missing []uuid.UUID
}

func (p *readingPublisher) Publish(ctx context.Context, msgs []idem.Message) error {
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		ids[i] = m.EventID
	}
	rows, err := p.pool.Query(ctx, `SELECT id FROM unnest($1::uuid[]) AS id WHERE NOT EXISTS (SELECT 1 FROM business b WHERE b.event_id = id)`, ids)
	if err != nil {
		return err // a fault: the relay publishes them again
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.missing = append(p.missing, missing...)
	p.mu.Unlock()
	return p.Publisher.Publish(ctx, msgs)
}

func (p *readingPublisher) notFound() []uuid.UUID {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]uuid.UUID(nil), p.missing...)
}

// writeWithRow commits ev through w with its business row, in one
// transaction of conn's.
func writeWithRow(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, w *outbox.Writer[pgx.Tx], ev idem.Event) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `INSERT INTO business (event_id) VALUES ($1)`, ev.ID); err != nil {
		return err
	}
	if err := w.Add(ctx, tx, ev); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// TestNothingPublishedBeforeVisible holds a transaction in the moment when
// its commit is in the log, sent to the relay, and not yet visible to other
// sessions: on a server of the test's own, a synchronous standby that
// never comes keeps the committing session waiting after its commit record
// is flushed, which is the moment every commit goes through, made as long
// as the test needs. The relay must not publish its event, nor the later
// event of its aggregate, until the transaction ends for other sessions
// (the session's wait is cancelled: the commit then completes locally), and
// a consumer that reads the producer's database then finds every row.
func TestNothingPublishedBeforeVisible(t *testing.T) {
	t.Parallel()
	srv := testdb.StartServer(t,
		"synchronous_standby_names = 'idem_absent_standby'",
		"synchronous_commit = local") // every session but the one that opts in
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	drv := postgres.NewPgx(pool)
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, businessTable); err != nil {
		t.Fatal(err)
	}
	pub := &readingPublisher{Publisher: memory.New(), pool: pool}
	cfg := fastConfig(t)
	cfg.Tables.Schema = "public"
	r, err := cdc.New(srv.URL, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(t, r) })
	eventually(t, 30*time.Second, "the relay streaming", func() bool { return r.Stats().Streaming })
	w := outbox.NewWriter(drv)

	// A first event, published as usual: the stream runs.
	first := event(t, "1", 1)
	if err := writeWithRow(ctx, pool, w, first); err != nil {
		t.Fatal(err)
	}
	waitLen(t, pub.Publisher, 1, 30*time.Second)

	// The held transaction: its session waits for the absent standby after
	// the commit record is flushed.
	held := event(t, "1", 2)
	conn, err := pgx.Connect(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	pid := conn.PgConn().PID()
	if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	heldDone := make(chan error, 1)
	go func() { heldDone <- writeWithRow(ctx, conn, w, held) }()
	released := false
	release := func() error {
		if released {
			return nil
		}
		released = true
		if _, err := pool.Exec(context.Background(), `SELECT pg_cancel_backend($1)`, pid); err != nil {
			return err
		}
		return <-heldDone
	}
	defer func() {
		_ = release()
		_ = conn.Close(context.Background())
	}()
	waitSyncRep(t, pool, pid)

	// Later transactions, visible at once: one of the held event's
	// aggregate, one of another.
	later, other := event(t, "1", 3), event(t, "2", 1)
	for _, ev := range []idem.Event{later, other} {
		if err := writeWithRow(ctx, pool, w, ev); err != nil {
			t.Fatal(err)
		}
	}
	// The sentinel: the relay has read the held commit and found it, twice,
	// not visible. Until then nothing says it had the chance to publish.
	eventually(t, 30*time.Second, "the relay finding the held transaction not visible", func() bool {
		return r.Stats().VisibilityWaits >= 2
	})
	for _, m := range pub.Messages() {
		if m.EventID == held.ID || m.EventID == later.ID {
			t.Fatalf("event %s published while its transaction (or the earlier one of its aggregate) was not visible", m.EventID)
		}
	}

	// The session's wait is cancelled: the transaction commits locally and
	// becomes visible.
	if err := release(); err != nil {
		t.Fatalf("the held transaction: %v", err)
	}
	msgs := waitLen(t, pub.Publisher, 4, 30*time.Second)
	checkAll(t, msgs, map[uuid.UUID]bool{first.ID: true, held.ID: true, later.ID: true, other.ID: true})
	checkFirstOrder(t, msgs)
	if missing := pub.notFound(); len(missing) > 0 {
		t.Errorf("events published before their business rows were visible: %v", missing)
	}
}

// waitSyncRep waits until the backend pid waits for a synchronous
// standby: its commit record is flushed, the walsender may send it.
func waitSyncRep(t *testing.T, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	eventually(t, 30*time.Second, "the held session waiting for its standby", func() bool {
		var event string
		err := pool.QueryRow(context.Background(), `SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&event)
		return err == nil && event == "SyncRep"
	})
}

// TestPublishedEventsAreVisibleUnderLoad has 8 writers commit 2,000
// transactions, each an event (half as table rows, half as WAL messages)
// and the business row it announces, while the relay publishes to a
// consumer that reads the producer's database on every event: it must find
// every row.
func TestPublishedEventsAreVisibleUnderLoad(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	pg.Exec(t, businessTable)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pub := &readingPublisher{Publisher: memory.New(), pool: pg.Pool}
	cfg := fastConfig(t)
	r := start(t, pg, pub, cfg)
	eventually(t, 30*time.Second, "the relay streaming", func() bool { return r.Stats().Streaming })
	rows := outbox.NewWriter(pg.Driver)
	logs, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	const writers, perWriter = 8, 250
	want := map[uuid.UUID]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				ev := event(t, fmt.Sprintf("w%d-%d", w, i%10), i/10+1)
				wr := rows
				if i%2 == 1 {
					wr = logs
				}
				if err := writeWithRow(ctx, pg.Pool, wr, ev); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				want[ev.ID] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	msgs := waitLen(t, pub.Publisher, writers*perWriter, 2*time.Minute)
	checkAll(t, msgs, want)
	checkFirstOrder(t, msgs)
	if missing := pub.notFound(); len(missing) > 0 {
		t.Errorf("%d of %d events published before their business rows were visible", len(missing), len(want))
	}
	t.Logf("%d events; the relay found a committed transaction not yet visible %d times", len(want), r.Stats().VisibilityWaits)
}
