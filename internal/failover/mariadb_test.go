package failover_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/binlog"
)

// vip stands for a virtual IP, or a proxy, in front of a MariaDB primary:
// a TCP forwarder on loopback whose target an operator moves to the new
// primary after a failover (go-sql-driver takes one address: the
// application's URL names the VIP). Moving it closes the connections to
// the old target, as the death of the old primary does.
type vip struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func startVIP(t *testing.T, target string) *vip {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	v := &vip{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	v.wg.Add(1)
	go v.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		v.closeAll()
		v.wg.Wait()
	})
	return v
}

func (v *vip) serve() {
	defer v.wg.Done()
	for {
		c, err := v.ln.Accept()
		if err != nil {
			return
		}
		v.mu.Lock()
		target := v.target
		v.mu.Unlock()
		s, err := net.DialTimeout("tcp", target, 2*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		v.mu.Lock()
		v.conns[c], v.conns[s] = struct{}{}, struct{}{}
		v.mu.Unlock()
		v.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer v.wg.Done()
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
			v.mu.Lock()
			delete(v.conns, dst)
			delete(v.conns, src)
			v.mu.Unlock()
		}
		go pipe(c, s)
		go pipe(s, c)
	}
}

// move sends the new connections to target and closes the open ones.
func (v *vip) move(target string) {
	v.mu.Lock()
	v.target = target
	v.mu.Unlock()
	v.closeAll()
}

func (v *vip) closeAll() {
	v.mu.Lock()
	defer v.mu.Unlock()
	for c := range v.conns {
		_ = c.Close()
	}
}

// url is the URL of the database name through the VIP.
func (v *vip) url(name string) string {
	return "mysql://idem:idem@" + v.ln.Addr().String() + "/" + name
}

// dbURL is the URL of the database name on a server.
func dbURL(srv *testdb.MariaDBServer, name string) string {
	return fmt.Sprintf("mysql://idem:idem@127.0.0.1:%d/%s", srv.Port, name)
}

// applyMariaDB adds 1 to the event's row in applied, on MariaDB.
const applyMariaDB = `INSERT INTO applied (event_id, n) VALUES (?, 1) ON DUPLICATE KEY UPDATE n = n + 1`

// newMariaSystem migrates the database of url (through the VIP) and makes
// the tables of orders; with polling, the polling relay and a consumer in
// the same database (the relay not started).
func newMariaSystem(t *testing.T, ctx context.Context, url string, polling bool) *system {
	t.Helper()
	db, err := mysql.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(12)
	drv := mysql.New(db)
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE orders (id CHAR(36) PRIMARY KEY, request VARCHAR(64) NOT NULL UNIQUE) ENGINE=InnoDB`,
		`CREATE TABLE applied (event_id CHAR(36) PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	s := &system{db: db, q: newQueue(), applied: map[uuid.UUID]time.Time{}}
	if polling {
		exec := func(ctx context.Context, tx *sql.Tx, q string, args ...any) error {
			_, err := tx.ExecContext(ctx, q, args...)
			return err
		}
		s.cons = newConsumer(t, s, drv, exec, applyMariaDB)
		s.relay = newRelay(t, s, drv)
	}
	return s
}

// placeOrder commits an order's row and its event in one transaction.
func placeOrder(ctx context.Context, db *sql.DB, w *outbox.Writer[*sql.Tx], id uuid.UUID, aggregate int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, request) VALUES (?, ?)`, id.String(), id.String()); err != nil {
		return err
	}
	ev := idem.Event{ID: id, Name: "order.placed", AggregateType: "order", AggregateID: fmt.Sprint(aggregate),
		OccurredAt: time.Now(), Payload: json.RawMessage(`{}`)}
	if err := w.Add(ctx, tx, ev); err != nil {
		return err
	}
	return tx.Commit()
}

// placeMaria places n orders, each again until it commits.
func placeMaria(t *testing.T, ctx context.Context, db *sql.DB, n int) []uuid.UUID {
	t.Helper()
	w := outbox.NewWriter(mysql.New(db))
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
		untilCommitted(t, ctx, func() error { return placeOrder(ctx, db, w, ids[i], i%5) })
	}
	return ids
}

// writeOrders has clients place orders on db until ctx ends; each order
// whose commit returned sends its id to acked. A failed commit is not
// retried (its outcome is unknown): the client places a new order.
func writeOrders(ctx context.Context, db *sql.DB, clients int, acked chan<- uuid.UUID) {
	w := outbox.NewWriter(mysql.New(db))
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				id := uuid.New()
				if err := placeOrder(ctx, db, w, id, c*50+i%50); err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				select {
				case acked <- id:
				case <-ctx.Done():
				}
			}
		}()
	}
	wg.Wait()
	close(acked)
}

// collect reads acked until it holds n ids.
func collect(t *testing.T, acked <-chan uuid.UUID, got *[]uuid.UUID, n int) {
	t.Helper()
	for len(*got) < n {
		id, ok := <-acked
		if !ok {
			t.Fatalf("the writers stopped after %d orders", len(*got))
		}
		*got = append(*got, id)
	}
}

// orderIDs returns the ids of the orders of db (the new primary's).
func orderIDs(t *testing.T, ctx context.Context, db *sql.DB) map[uuid.UUID]bool {
	t.Helper()
	rows, err := db.QueryContext(ctx, `SELECT id FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[uuid.UUID]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out[uuid.MustParse(id)] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// published counts each event's publications.
func (q *queue) published() map[uuid.UUID]int {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := map[uuid.UUID]int{}
	for _, m := range q.msgs {
		out[m.EventID]++
	}
	return out
}

// waitPublished waits until q has published every event of ids.
func waitPublished(t *testing.T, q *queue, ids []uuid.UUID) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pub, missing := q.published(), 0
		for _, id := range ids {
			if pub[id] == 0 {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events never published", missing, len(ids))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startBinlog starts a binlog relay on the database of url, publishing
// into q; it stops when the test ends.
func startBinlog(t *testing.T, ctx context.Context, url string, q *queue) *binlog.Relay {
	t.Helper()
	r, err := binlog.New(url, q, binlog.Config{Heartbeat: time.Second, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopBinlog(r) })
	return r
}

// stopBinlog stops a relay, waiting at most 10 s (one whose server died
// abandons what it was publishing).
func stopBinlog(r *binlog.Relay) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = r.Stop(ctx)
}

// TestMariaDBSemiSync: a MariaDB primary and its semi-synchronous replica
// (AFTER_SYNC), two services under load through a VIP: one whose outbox
// the binlog relay publishes, one with the polling relay and a consumer.
// The primary is killed (SIGKILL), the replica promoted (its relay log
// applied, RESET SLAVE ALL, read_only off), the VIP moved, and the binlog
// relay, which takes one URL, restarted with the new primary's: it goes on
// from the GTID position it stored, which the new primary's binlog holds
// (log_slave_updates). Nothing acknowledged is lost, the binlog relay
// published no event of a transaction the new primary lacks, it published
// every order there, and the consumer applied each order once.
func TestMariaDBSemiSync(t *testing.T) {
	primary := testdb.StartMariaDB(t, testdb.SharedBinlog...)
	replica := primary.StartReplica(t, testdb.Sync)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary.Exec(t, "CREATE DATABASE idem_poll CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
	v := startVIP(t, fmt.Sprintf("127.0.0.1:%d", primary.Port))

	cdc := newMariaSystem(t, ctx, v.url("idem_test"), false)
	poll := newMariaSystem(t, ctx, v.url("idem_poll"), true)
	relay1 := startBinlog(t, ctx, dbURL(primary, "idem_test"), cdc.q)
	poll.startRelay(t, ctx)
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan struct{})
	go func() { defer close(consumed); poll.consume(cctx) }()
	defer func() { stopConsumer(); <-consumed }()
	// On a failure before the kill, commits wait for the replica: the
	// primary goes first.
	alive := true
	defer func() {
		if alive {
			primary.Kill(t)
		}
	}()

	wctx, stopWriters := context.WithCancel(ctx)
	defer stopWriters()
	ackedCDC, ackedPoll := make(chan uuid.UUID, 1000), make(chan uuid.UUID, 1000)
	go writeOrders(wctx, cdc.db, 3, ackedCDC)
	go writeOrders(wctx, poll.db, 3, ackedPoll)
	var cdcIDs, pollIDs []uuid.UUID
	collect(t, ackedCDC, &cdcIDs, 400)
	collect(t, ackedPoll, &pollIDs, 400)
	before := len(cdcIDs) + len(pollIDs)

	// The replica stops receiving, and the primary writes a transaction
	// the replica lacks to its binlog. Semi-synchronous, it acknowledges
	// none of them and shows none to the relays (its commits wait for the
	// replica, at most one group commit of them in the binlog);
	// asynchronous, it would acknowledge them, and the binlog relay
	// publish them.
	primary.PauseReplication(t, replica)
	testsvc.WaitFor(t, 30*time.Second, "a transaction the replica lacks", func() bool { return primary.Unreceived(t, replica) >= 1 })
	primary.Kill(t)
	alive = false
	killed := time.Now()
	replica.Promote(t)
	v.move(fmt.Sprintf("127.0.0.1:%d", replica.Port))
	promoted := time.Since(killed)
	stopBinlog(relay1)
	relay2 := startBinlog(t, ctx, dbURL(replica, "idem_test"), cdc.q)
	restarted := time.Since(killed)

	collect(t, ackedCDC, &cdcIDs, len(cdcIDs)+400)
	collect(t, ackedPoll, &pollIDs, len(pollIDs)+400)
	stopWriters()
	for id := range ackedCDC {
		cdcIDs = append(cdcIDs, id)
	}
	for id := range ackedPoll {
		pollIDs = append(pollIDs, id)
	}

	// The binlog relay's service: every order of the new primary
	// published, every acknowledged one there, and nothing published that
	// the new primary lacks.
	orders := orderIDs(t, ctx, cdc.db)
	all := make([]uuid.UUID, 0, len(orders))
	for id := range orders {
		all = append(all, id)
	}
	waitPublished(t, cdc.q, all)
	for _, id := range cdcIDs {
		if !orders[id] {
			t.Errorf("binlog relay's service: acknowledged order %s lost", id)
		}
	}
	pub, twice := cdc.q.published(), 0
	for id, n := range pub {
		if !orders[id] {
			t.Errorf("binlog relay: published event %s, whose transaction the new primary does not have", id)
		}
		if n > 1 {
			twice++
		}
	}

	// The polling relay's service: every order applied once, every
	// acknowledged one there.
	deadline := time.Now().Add(90 * time.Second)
	for {
		var missing int
		err := poll.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders o LEFT JOIN applied a ON a.event_id = o.id WHERE a.event_id IS NULL`).Scan(&missing)
		if err == nil && missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d orders of the new primary never applied by the consumer (%v)", missing, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	pollOrderIDs := orderIDs(t, ctx, poll.db)
	for _, id := range pollIDs {
		if !pollOrderIDs[id] {
			t.Errorf("polling relay's service: acknowledged order %s lost", id)
		}
	}
	var pollOrders, applied, more int
	if err := poll.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM orders), (SELECT COUNT(*) FROM applied),
    (SELECT COUNT(*) FROM applied WHERE n <> 1)`).Scan(&pollOrders, &applied, &more); err != nil {
		t.Fatal(err)
	}
	if applied != pollOrders || more != 0 {
		t.Errorf("polling relay's service: %d orders, %d applied, %d more than once: want each applied once", pollOrders, applied, more)
	}
	if n := poll.parked.Load(); n != 0 {
		t.Errorf("%d messages parked: a failover must cost time only", n)
	}
	if s := relay2.Stats(); s.Published == 0 {
		t.Errorf("the relay on the new primary published nothing: %+v", s)
	}
	t.Logf("acknowledged %d orders (%d before the kill); binlog relay: %d orders, %d events published, %d of them more than once; polling relay: %d orders applied once",
		len(cdcIDs)+len(pollIDs), before, len(orders), len(pub), twice, applied)
	t.Logf("after the kill: promoted and VIP moved %v, binlog relay restarted %v", promoted.Round(time.Millisecond), restarted.Round(time.Millisecond))
}

// TestMariaDBAsync shows what a failover to an asynchronous replica loses
// under the binlog relay, and what the relay does on the new primary:
//
//   - orders A0 are published, and the relay's position after them is
//     stored and replicated (the relay stopped meanwhile);
//   - orders A are committed and replicated; then, in the tail, the relay
//     publishes them, deletes their rows and stores its position. After the
//     failover the relay, restarted with the new primary's URL, goes on
//     from the position stored there (after A0), found in the new
//     primary's binlog (log_slave_updates): it publishes A again;
//   - orders B are committed in the tail and published: they are gone from
//     the new primary with their transactions, and nothing publishes them
//     again, but the broker had them: events of transactions that no
//     longer exist;
//   - orders C, placed after the failover, are published once.
func TestMariaDBAsync(t *testing.T) {
	primary := testdb.StartMariaDB(t, testdb.SharedBinlog...)
	replica := primary.StartReplica(t, testdb.Async)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := newMariaSystem(t, ctx, dbURL(primary, "idem_test"), false)

	relay1 := startBinlog(t, ctx, dbURL(primary, "idem_test"), s.q)
	a0 := placeMaria(t, ctx, s.db, 10)
	waitPublished(t, s.q, a0)
	stopBinlog(relay1)
	a := placeMaria(t, ctx, s.db, 20)
	primary.ReplicatedAll(t, replica)
	primary.PauseReplication(t, replica)
	// From here on, the primary's writes are the tail.
	relay2 := startBinlog(t, ctx, dbURL(primary, "idem_test"), s.q)
	waitPublished(t, s.q, a)
	b := placeMaria(t, ctx, s.db, 20)
	waitPublished(t, s.q, b)
	publishedBefore := s.q.len()

	primary.Kill(t)
	replica.Promote(t)
	stopBinlog(relay2)
	newPrimary, err := mysql.Open(dbURL(replica, "idem_test"))
	if err != nil {
		t.Fatal(err)
	}
	defer newPrimary.Close()
	var stored string
	if err := newPrimary.QueryRowContext(ctx, `SELECT gtid_pos FROM binlog_position WHERE outbox_table = 'outbox'`).Scan(&stored); err != nil {
		t.Fatalf("the position stored on the new primary: %v", err)
	}
	startBinlog(t, ctx, dbURL(replica, "idem_test"), s.q)
	c := placeMaria(t, ctx, newPrimary, 10)
	waitPublished(t, s.q, append(append([]uuid.UUID{}, a...), c...))

	orders := orderIDs(t, ctx, newPrimary)
	pub := s.q.published()
	check := func(name string, ids []uuid.UUID, onNew bool, times int) {
		t.Helper()
		for _, id := range ids {
			if orders[id] != onNew || pub[id] != times {
				t.Errorf("order %s %s: on the new primary %v, published %d times; want %v, %d", name, id, orders[id], pub[id], onNew, times)
			}
		}
	}
	check("A0", a0, true, 1)
	check("A", a, true, 2)
	check("B", b, false, 1)
	check("C", c, true, 1)
	var outboxB int
	if err := newPrimary.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox WHERE id IN (`+strings.Repeat("?, ", len(b)-1)+`?)`, uuidArgs(b)...).Scan(&outboxB); err != nil {
		t.Fatal(err)
	}
	if outboxB != 0 {
		t.Errorf("%d outbox rows of B on the new primary, want none (lost with their transactions)", outboxB)
	}
	t.Logf("stored position on the new primary %s; lost tail: %d A published again, %d B gone after %d messages published; %d published in all",
		stored, len(a), len(b), publishedBefore, s.q.len())
}

func uuidArgs(ids []uuid.UUID) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}
