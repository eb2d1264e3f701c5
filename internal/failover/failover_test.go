package failover_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// queue is an in-process broker: Publish appends (a confirmed publish),
// and the consumer loop reads in order, acknowledging a message by moving
// past it once the consumer acked it.
type queue struct {
	mu      sync.Mutex
	msgs    []idem.Message
	first   map[uuid.UUID]time.Time // when each event was first published
	changed chan struct{}
}

func newQueue() *queue {
	return &queue{changed: make(chan struct{}), first: map[uuid.UUID]time.Time{}}
}

func (q *queue) Publish(_ context.Context, msgs []idem.Message) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	for _, m := range msgs {
		q.msgs = append(q.msgs, m)
		if _, ok := q.first[m.EventID]; !ok {
			q.first[m.EventID] = now
		}
	}
	close(q.changed)
	q.changed = make(chan struct{})
	return nil
}

// get returns message i, waiting for it until ctx ends.
func (q *queue) get(ctx context.Context, i int) (idem.Message, bool) {
	for {
		q.mu.Lock()
		if i < len(q.msgs) {
			m := q.msgs[i]
			q.mu.Unlock()
			return m, true
		}
		ch := q.changed
		q.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return idem.Message{}, false
		}
	}
}

// len returns the number of messages published.
func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.msgs)
}

// earliest returns the earliest first publication of the events ids.
func (q *queue) earliest(ids []uuid.UUID) (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return earliest(q.first, ids)
}

func earliest(m map[uuid.UUID]time.Time, ids []uuid.UUID) (time.Time, bool) {
	var first time.Time
	for _, id := range ids {
		if at, ok := m[id]; ok && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first, !first.IsZero()
}

var _ broker.Publisher = (*queue)(nil)

// system is a service on a failing cluster: its pool on the multi-host URL,
// the polling relay publishing its outbox into q, and a consumer (its
// inbox in the same database) applying what q holds: each application
// adds 1 to the event's row in applied, in the consumer's transaction.
type system struct {
	pool  *pgxpool.Pool
	drv   *postgres.PgxDriver
	q     *queue
	db    *sql.DB // the database/sql handle of the database/sql variant
	relay interface{ Stop(context.Context) error }
	cons  interface {
		Deliver(context.Context, inbox.Delivery) (inbox.Disposition, error)
	}
	handler http.Handler // POST /orders

	handled sync.Map // event id -> *atomic.Int64: handler runs, committed or not
	parked  atomic.Int64

	mu      sync.Mutex
	applied map[uuid.UUID]time.Time // when the consumer loop saw each event applied
}

func logger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newSystem migrates the database of url and makes the system's parts on
// pgx, or with viaSQL on database/sql (pgx's stdlib driver); its pool, on
// pgx, serves the test's own checks.
func newSystem(t *testing.T, ctx context.Context, url string, viaSQL bool) *system {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &system{pool: pool, drv: postgres.NewPgx(pool), q: newQueue(), applied: map[uuid.UUID]time.Time{}}
	if _, err := migrate.New(s.drv).Up(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE orders (id uuid PRIMARY KEY, request text NOT NULL UNIQUE)`,
		`CREATE TABLE applied (event_id uuid PRIMARY KEY, n int NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if !viaSQL {
		exec := func(ctx context.Context, tx pgx.Tx, q string, args ...any) error {
			_, err := tx.Exec(ctx, q, args...)
			return err
		}
		s.cons = newConsumer(t, s, s.drv, exec, applyPG)
		s.handler = newAPI(t, s.drv, exec)
		s.relay = newRelay(t, s, s.drv)
		return s
	}
	s.db, err = sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.db.Close() })
	s.db.SetMaxOpenConns(12)
	sdrv := postgres.NewSQL(s.db)
	exec := func(ctx context.Context, tx *sql.Tx, q string, args ...any) error {
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	}
	s.cons = newConsumer(t, s, sdrv, exec, applyPG)
	s.handler = newAPI(t, sdrv, exec)
	s.relay = newRelay(t, s, sdrv)
	return s
}

// applyPG adds 1 to the event's row in applied, on PostgreSQL.
const applyPG = `INSERT INTO applied (event_id, n) VALUES ($1, 1)
			ON CONFLICT (event_id) DO UPDATE SET n = applied.n + 1`

// newConsumer returns the consumer: each application of an event adds 1 to
// its row in applied (the statement apply, of one argument: the event's
// id), in the consumer's transaction.
func newConsumer[TTx any](t *testing.T, s *system, drv driver.Driver[TTx], exec func(context.Context, TTx, string, ...any) error, apply string) *inbox.Consumer[TTx] {
	t.Helper()
	cons, err := inbox.New(drv, inbox.Config{Name: "failover", Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	cons.Handle("order.placed", func(ctx context.Context, tx TTx, ev idem.Event) error {
		c, _ := s.handled.LoadOrStore(ev.ID, new(atomic.Int64))
		c.(*atomic.Int64).Add(1)
		return exec(ctx, tx, apply, ev.ID)
	})
	return cons
}

// newRelay returns the polling relay, not started (startRelay).
func newRelay[TTx any](t *testing.T, s *system, drv driver.Driver[TTx]) *relay.Relay[TTx] {
	t.Helper()
	r, err := relay.New(drv, s.q, relay.Config{Lease: 5 * time.Second, PollInterval: 200 * time.Millisecond, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// startRelay starts the polling relay; it stops when the test ends.
func (s *system) startRelay(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := s.relay.(interface{ Start(context.Context) error }).Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.relay.Stop(ctx)
	})
}

// consume delivers the queue's messages in order, one at a time, as a
// transport does: a message is delivered again until the consumer acks it.
func (s *system) consume(ctx context.Context) {
	for i := 0; ; {
		m, ok := s.q.get(ctx, i)
		if !ok {
			return
		}
		d, err := s.cons.Deliver(ctx, inbox.Delivery{Message: m, Source: "failover", Attempt: 1})
		if err == nil && d.Action == broker.Ack {
			if d.Outcome == broker.Parked {
				s.parked.Add(1)
			}
			if d.Outcome == broker.Applied {
				s.mu.Lock()
				if _, ok := s.applied[m.EventID]; !ok {
					s.applied[m.EventID] = time.Now()
				}
				s.mu.Unlock()
			}
			i++
			continue
		}
		wait := 50 * time.Millisecond
		if err == nil && d.RetryAfter > 0 {
			wait = min(d.RetryAfter, time.Second)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
	}
}

// order is an order placed through the Idempotency-Key middleware: the
// order's row, its event in the outbox and the key, in one transaction.
type order struct {
	ID  uuid.UUID `json:"id"`
	Key string    `json:"-"`
	// Sent is when its first request was sent.
	Sent time.Time `json:"-"`
}

// newAPI returns POST /orders behind the idempotency middleware: the
// order's row, its event in the outbox and the key, in one transaction.
func newAPI[TTx any](t *testing.T, drv driver.Driver[TTx], exec func(context.Context, TTx, string, ...any) error) http.Handler {
	t.Helper()
	keys, err := idempotency.New(drv, idempotency.Config{LockTimeout: 2 * time.Second, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	w := outbox.NewWriter(drv)
	place := func(ctx context.Context, tx TTx, r *http.Request) (idempotency.Response, error) {
		var o order
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			return idempotency.Response{Status: http.StatusBadRequest}, nil
		}
		if err := exec(ctx, tx, `INSERT INTO orders (id, request) VALUES ($1, $2)`, o.ID, r.Header.Get(idempotency.HeaderKey)); err != nil {
			return idempotency.Response{}, err
		}
		ev := idem.Event{ID: o.ID, Name: "order.placed", AggregateType: "order", AggregateID: fmt.Sprint(o.ID.ID() % 50),
			OccurredAt: time.Now(), Payload: json.RawMessage(`{}`)}
		if err := w.Add(ctx, tx, ev); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: http.StatusCreated, Body: []byte(o.ID.String())}, nil
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", keys.TxHandler(place))
	return mux
}

// placeOrders has clients place orders until ctx ends, each retrying a
// request with its key until it gets a 201; it returns the orders
// acknowledged (201 received).
func placeOrders(ctx context.Context, url string, clients int, acked chan<- order) {
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 10 * time.Second}
			for ctx.Err() == nil {
				o := order{ID: uuid.New(), Key: uuid.NewString(), Sent: time.Now()}
				body, _ := json.Marshal(o)
				for ctx.Err() == nil {
					req, _ := http.NewRequest(http.MethodPost, url+"/orders", bytes.NewReader(body))
					req.Header.Set(idempotency.HeaderKey, o.Key)
					resp, err := client.Do(req)
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode == http.StatusCreated {
							acked <- o
							break
						}
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	close(acked)
}

// TestSynchronousStandby: orders placed by clients through the
// Idempotency-Key middleware, the polling relay publishing and a consumer
// applying, all on one pool on a multi-host URL, while the primary is
// killed (SIGKILL of its every process) and its synchronous standby
// promoted. Nothing acknowledged is lost: every order a client got its 201
// for is on the new primary, and every order there (acknowledged or not)
// was applied by the consumer exactly once; nothing was parked, and
// nothing was restarted.
func TestSynchronousStandby(t *testing.T) {
	t.Run("pgx", func(t *testing.T) { synchronousStandby(t, false, false) })
	t.Run("database-sql", func(t *testing.T) { synchronousStandby(t, true, false) })
	// A primary that freezes resets no connection: the statements in
	// flight wait for their timeouts (the relay's QueryTimeout, the
	// consumer's DeliveryTimeout, the clients' 10 s).
	t.Run("pgx-frozen", func(t *testing.T) { synchronousStandby(t, false, true) })
}

func synchronousStandby(t *testing.T, viaSQL, freeze bool) {
	primary := testdb.StartServer(t)
	standby := primary.StartStandby(t, testdb.Sync)
	url := testdb.MultiHostURL("postgres", primary, standby)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	s := newSystem(t, ctx, url, viaSQL)
	s.startRelay(t, ctx)
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan struct{})
	go func() { defer close(consumed); s.consume(cctx) }()
	defer func() { stopConsumer(); <-consumed }()
	srv := httptest.NewServer(s.handler)
	defer srv.Close()

	wctx, stopWriters := context.WithCancel(ctx)
	ackedCh := make(chan order, 1000)
	go placeOrders(wctx, srv.URL, 4, ackedCh)
	var acked []order
	ackedAt := func(n int) {
		for len(acked) < n {
			o, ok := <-ackedCh
			if !ok {
				t.Fatalf("the clients stopped after %d orders", len(acked))
			}
			acked = append(acked, o)
		}
	}
	ackedAt(300)
	before := len(acked)

	// The time of the kill is when every process of the primary is dead
	// (or stopped): Kill scans them for a few milliseconds.
	if freeze {
		primary.Freeze(t)
	} else {
		primary.Kill(t)
	}
	killed := time.Now()
	standby.Promote(t)
	promoted := time.Since(killed)
	t.Logf("primary killed (frozen: %v); standby promoted %v later", freeze, promoted.Round(time.Millisecond))

	// Orders go on on the new primary.
	ackedAt(before + 300)
	firstAck := time.Since(killed) // bounded by the 300 orders: an upper bound
	stopWriters()
	for o := range ackedCh {
		acked = append(acked, o)
	}

	// Every order committed on the new primary reaches the consumer.
	deadline := time.Now().Add(90 * time.Second)
	for {
		var missing int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM applied a WHERE a.event_id = o.id)`).Scan(&missing)
		if err == nil && missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d orders of the new primary never applied by the consumer (%v)", missing, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	caughtUp := time.Since(killed)

	var orders, applied, twice, unpublished int
	if err := s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM applied),
		(SELECT count(*) FROM applied WHERE n <> 1), (SELECT count(*) FROM outbox WHERE published_at IS NULL)`).Scan(&orders, &applied, &twice, &unpublished); err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, len(acked))
	for i, o := range acked {
		ids[i] = o.ID
	}
	var ackedFound int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM orders o JOIN applied a ON a.event_id = o.id WHERE o.id = ANY($1)`, ids).Scan(&ackedFound); err != nil {
		t.Fatal(err)
	}
	if ackedFound != len(acked) {
		t.Errorf("%d of the %d acknowledged orders are on the new primary and applied: acknowledged orders lost", ackedFound, len(acked))
	}
	if applied != orders || twice != 0 {
		t.Errorf("%d orders, %d applied events, %d applied more than once: want each order's event applied exactly once", orders, applied, twice)
	}
	if n := s.parked.Load(); n != 0 {
		t.Errorf("%d messages parked: a failover must cost time only", n)
	}
	// The orders placed after the kill: committed on the new primary.
	var post []uuid.UUID
	for _, o := range acked {
		if o.Sent.After(killed) {
			post = append(post, o.ID)
		}
	}
	relayBack, ok := s.q.earliest(post)
	if !ok {
		t.Fatal("the relay published no order placed after the kill")
	}
	s.mu.Lock()
	consumerBack, ok := earliest(s.applied, post)
	// The first application of any order once the standby was promoted
	// (one seen just after the kill may have committed just before it).
	var resumed time.Time
	for _, at := range s.applied {
		if at.After(killed.Add(promoted)) && (resumed.IsZero() || at.Before(resumed)) {
			resumed = at
		}
	}
	s.mu.Unlock()
	if !ok {
		t.Fatal("the consumer applied no order placed after the kill")
	}
	t.Logf("orders %d (acknowledged %d, %d before the kill), published %d messages (duplicates included), unpublished %d",
		orders, len(acked), before, s.q.len(), unpublished)
	t.Logf("after the kill: promoted %v, relay publishing new orders %v, consumer applying again %v (new orders %v), 300 more orders acknowledged %v, every order applied %v",
		promoted.Round(time.Millisecond), relayBack.Sub(killed).Round(time.Millisecond), resumed.Sub(killed).Round(time.Millisecond),
		consumerBack.Sub(killed).Round(time.Millisecond), firstAck.Round(time.Millisecond), caughtUp.Round(time.Millisecond))
	p := killed.Add(promoted)
	t.Logf("after the promotion: relay publishing new orders %v, consumer applying again %v (new orders %v)",
		relayBack.Sub(p).Round(time.Millisecond), resumed.Sub(p).Round(time.Millisecond), consumerBack.Sub(p).Round(time.Millisecond))
}

// placeDirect places orders in transactions of their own (the order's row
// and its event), each again until it commits.
func (s *system) placeDirect(t *testing.T, ctx context.Context, n int) []uuid.UUID {
	t.Helper()
	w := outbox.NewWriter[pgx.Tx](s.drv)
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
		ev := idem.Event{ID: ids[i], Name: "order.placed", AggregateType: "order", AggregateID: fmt.Sprint(i % 5),
			OccurredAt: time.Now(), Payload: json.RawMessage(`{}`)}
		untilCommitted(t, ctx, func() error {
			return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO orders (id, request) VALUES ($1, $2)`, ev.ID, ev.ID.String()); err != nil {
					return err
				}
				return w.Add(ctx, tx, ev)
			})
		})
	}
	return ids
}

// untilCommitted runs place until it returns nil, failing the test when
// ctx ends first.
func untilCommitted(t *testing.T, ctx context.Context, place func() error) {
	t.Helper()
	for {
		err := place()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// appliedOn counts the events of ids applied (once, twice) on the
// database the pool reaches now.
func (s *system) appliedOn(ctx context.Context, ids []uuid.UUID) (once, more int, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE n = 1), count(*) FILTER (WHERE n > 1) FROM applied WHERE event_id = ANY($1)`, ids).Scan(&once, &more)
	return once, more, err
}

func (s *system) waitApplied(t *testing.T, ctx context.Context, ids []uuid.UUID) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		once, more, err := s.appliedOn(ctx, ids)
		if err == nil && once+more == len(ids) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events applied (%v)", once+more, len(ids), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *system) handledTimes(id uuid.UUID) int64 {
	c, ok := s.handled.Load(id)
	if !ok {
		return 0
	}
	return c.(*atomic.Int64).Load()
}

// TestAsynchronousStandby shows what a failover to an asynchronous standby
// loses and what idem then does. The tail the standby had not received
// when the primary died is lost, every write of it:
//
//   - orders A were committed and replicated; then, in the tail, the relay
//     published them (its published_at marks) and the consumer applied them
//     (its markers and effects). After the failover A's rows are
//     unpublished again: the relay publishes them again and the consumer,
//     its markers gone with its effects, applies them again: each A is
//     handled twice, and its effect is on the new primary once;
//   - orders B were committed in the tail (each order and its outbox row
//     in one transaction), published and applied: they are gone from the
//     new primary with their business transaction, and nothing publishes
//     them again; but the broker had them, and a consumer whose database
//     survived keeps their effects: events of transactions that no longer
//     exist;
//   - orders placed after the failover go through as usual.
func TestAsynchronousStandby(t *testing.T) {
	primary := testdb.StartServer(t)
	standby := primary.StartStandby(t, testdb.Async)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := newSystem(t, ctx, testdb.MultiHostURL("postgres", primary, standby), false)

	a := s.placeDirect(t, ctx, 20)
	primary.ReplayedAll(t, standby)
	primary.PauseReplication(t, standby)
	// From here on, the primary's writes are the tail.
	s.startRelay(t, ctx)
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan struct{})
	go func() { defer close(consumed); s.consume(cctx) }()
	defer func() { stopConsumer(); <-consumed }()
	s.waitApplied(t, ctx, a)
	b := s.placeDirect(t, ctx, 20)
	s.waitApplied(t, ctx, b)
	published := s.q.len()

	primary.Kill(t)
	standby.Promote(t)

	c := s.placeDirect(t, ctx, 10)
	s.waitApplied(t, ctx, c)
	s.waitApplied(t, ctx, a)

	var ordersA, ordersB, outboxB, appliedB int
	if err := s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders WHERE id = ANY($1)), (SELECT count(*) FROM orders WHERE id = ANY($2)),
		(SELECT count(*) FROM outbox WHERE id = ANY($2)), (SELECT count(*) FROM applied WHERE event_id = ANY($2))`, a, b).Scan(&ordersA, &ordersB, &outboxB, &appliedB); err != nil {
		t.Fatal(err)
	}
	if ordersA != len(a) || ordersB != 0 || outboxB != 0 || appliedB != 0 {
		t.Fatalf("on the new primary: orders A %d/%d, orders B %d, B's outbox rows %d, B applied %d: want A kept, B gone", ordersA, len(a), ordersB, outboxB, appliedB)
	}
	for _, id := range a {
		if n := s.handledTimes(id); n != 2 {
			t.Errorf("order A %s handled %d times, want 2 (its first application was in the lost tail)", id, n)
		}
	}
	if once, more, err := s.appliedOn(ctx, a); err != nil || once != len(a) || more != 0 {
		t.Errorf("A on the new primary: applied once %d, more %d (%v); want each once", once, more, err)
	}
	for _, id := range b {
		if n := s.handledTimes(id); n != 1 {
			t.Errorf("order B %s handled %d times, want 1 (published and applied in the lost tail, never again)", id, n)
		}
	}
	for _, id := range c {
		if n := s.handledTimes(id); n != 1 {
			t.Errorf("order C %s handled %d times, want 1", id, n)
		}
	}
	if n := s.parked.Load(); n != 0 {
		t.Errorf("%d messages parked", n)
	}
	t.Logf("lost tail: %d A applied again (handled twice, once on the new primary), %d B gone with their orders after %d messages published; %d published in all",
		len(a), len(b), published, s.q.len())
}
