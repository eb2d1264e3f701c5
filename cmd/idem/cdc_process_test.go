package main

// Process tests of "idem cdc": the command built with fault points, run as a
// child process against the test PostgreSQL (wal_level=logical) and
// RabbitMQ, killed with SIGKILL at its fault points, and checked through a
// real idempotent consumer and what the broker delivered.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/webhook"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/cdc"
)

var (
	faultBinOnce sync.Once
	faultBin     string
	faultBinErr  error
	// testBinDir holds the binaries the tests build; TestMain removes it.
	testBinDir string
)

// faultBinary builds idem once per test run with fault points, for the
// process tests that kill it at them, and returns its path.
func faultBinary(t *testing.T) string {
	t.Helper()
	faultBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idem-cmd-test-")
		if err != nil {
			faultBinErr = err
			return
		}
		testBinDir = dir
		faultBin = filepath.Join(dir, "idem")
		// go test puts its own go first in PATH; the package's directory is
		// the working directory.
		if out, err := exec.Command("go", "build", "-tags", fault.Tag, "-o", faultBin, ".").CombinedOutput(); err != nil {
			faultBinErr = fmt.Errorf("go build -tags %s ./cmd/idem: %v\n%s", fault.Tag, err, out)
		}
	})
	if faultBinErr != nil {
		t.Fatal(faultBinErr)
	}
	return faultBin
}

// removeTestBinaries removes what faultBinary built.
func removeTestBinaries() {
	if testBinDir != "" {
		_ = os.RemoveAll(testBinDir)
	}
}

// cdcProc is a running idem command: "idem cdc", or another (startProc).
type cdcProc struct {
	name string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

// startCDC starts "idem cdc" on pg's outbox (slot cdcSlot(pg)) publishing
// to brokerURL, with the fault point armed when point is set.
func startCDC(t *testing.T, name string, pg *testdb.PG, brokerURL, point string, extra ...string) *cdcProc {
	t.Helper()
	args := append([]string{"cdc", "--db", pg.URL, "--broker", brokerURL, "--schema", pg.Schema, "--slot", cdcSlot(pg), "--prefix", cdcPrefix(pg),
		"--metrics-addr", "", "--log-level", "debug"}, extra...)
	return startProc(t, name, []string{fault.EnvVar + "=" + point}, args...)
}

// startProc starts the idem binary (faultBinary) with args and env added
// to the test's environment, its stdout and stderr in out; the process is
// killed when the test ends, and its output logged if the test failed.
func startProc(t *testing.T, name string, env []string, args ...string) *cdcProc {
	t.Helper()
	cmd := exec.Command(faultBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	p := &cdcProc{name: name, cmd: cmd, out: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("idem %s (%s) output:\n%s", args[0], name, tail(p.out.String(), 6000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func (p *cdcProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *cdcProc) kill() {
	if !p.exited() {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

// waitFault waits until the process killed itself at its fault point.
func (p *cdcProc) waitFault(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("idem cdc (%s) did not hit its fault point within %v:\n%s", p.name, d, tail(p.out.String(), 4000))
	}
	ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("idem cdc (%s) exited with %v, want killed at its fault point:\n%s", p.name, ws, tail(p.out.String(), 4000))
	}
}

// stop sends SIGTERM and checks a graceful exit.
func (p *cdcProc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("idem cdc (%s) still running 30s after SIGTERM", p.name)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("idem cdc (%s) exited with %d after SIGTERM:\n%s", p.name, code, tail(p.out.String(), 4000))
	}
}

// waitStreaming waits until the process streams from its slot (its debug
// log says "replication started"): events committed before the slot
// exists, or while it is being created (the slot is already listed,
// active, then), are not in its stream.
func (p *cdcProc) waitStreaming(t *testing.T) {
	t.Helper()
	testsvc.WaitFor(t, 60*time.Second, "idem cdc ("+p.name+") streaming from its slot", func() bool {
		return strings.Contains(p.out.String(), "replication started")
	})
}

// cdcPrefix is the prefix of the WAL messages of pg's outbox. WAL messages
// are not filtered by publication: every slot of the database reads them
// all, so each test schema has a prefix of its own, or the relays of tests
// running at once would publish each other's.
func cdcPrefix(pg *testdb.PG) string { return "idem.outbox." + pg.Schema }

// cdcSlot is the slot of the tests' relays on pg: one per test schema.
func cdcSlot(pg *testdb.PG) string { return "idem_" + pg.Schema + "_outbox" }

// dropSlotAtCleanup drops pg's slot (and its publication) when the test
// ends, after its processes (cleanups run last first): a slot left behind
// would keep the test server's WAL. The server may take a moment to see that
// a killed reader is gone.
func dropSlotAtCleanup(t *testing.T, pg *testdb.PG) {
	t.Cleanup(func() {
		slot := cdcSlot(pg)
		deadline := time.Now().Add(20 * time.Second)
		for {
			var n int
			if err := pg.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&n); err != nil {
				t.Errorf("replication slots: %v", err)
				return
			}
			if n == 0 {
				break
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := cdc.DropSlot(ctx, pg.URL, slot)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("drop slot %s: %v", slot, err)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		_, _ = pg.Pool.Exec(context.Background(), `DROP PUBLICATION IF EXISTS "`+slot+`"`)
	})
}

// rabbit is a fresh exchange on the test RabbitMQ with two queues bound to
// every event: one read by an idempotent consumer on PostgreSQL (consumer
// "stock", brokertest.EffectConsumer), one by a recorder of every delivery,
// which also looks, in the producer's database, for the business row that
// writeLoad commits with each event, as a consumer that reads the
// producer's database on an event would.
type rabbit struct {
	url, exchange string
	consumer      *inbox.Consumer[pgx.Tx]
	pg            *testdb.PG
	// seen looks the business row of an event up in the producer's
	// database: pg's by default.
	seen func(ctx context.Context, id uuid.UUID) (bool, error)

	mu        sync.Mutex
	delivered []delivered
}

// delivered is one message as the broker delivered it.
type delivered struct {
	id      uuid.UUID
	key     string
	version int64
	// unseen: the producer's database, read when the message arrived, did
	// not show the business row committed with the event.
	unseen bool
}

// businessTable holds a row per event writeLoad writes, committed with it.
const businessTable = `CREATE TABLE IF NOT EXISTS business (event_id uuid PRIMARY KEY)`

func newRabbit(t *testing.T, pg *testdb.PG, amqpURL string) *rabbit {
	t.Helper()
	pg.Exec(t, businessTable)
	r := &rabbit{url: amqpURL, exchange: testamqp.Name("idem_cdc_"), pg: pg}
	r.seen = func(ctx context.Context, id uuid.UUID) (bool, error) {
		var seen bool
		err := pg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM business WHERE event_id = $1)`, id).Scan(&seen)
		return seen, err
	}
	r.consumer = brokertest.EffectConsumer(t, pg.Driver, inbox.Config{Name: "stock"}, nil)
	sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: amqpURL, ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, Logger: brokertest.Logger()},
		Exchange:   r.exchange, Queue: r.exchange + ".stock", Bindings: []string{"#"},
	}, r.consumer.DeliverBatch)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)
	r.record(t)
	return r
}

// brokerURL is the URL idem cdc publishes to: the test node, the test's
// exchange.
func (r *rabbit) brokerURL() string {
	sep := "?"
	if strings.Contains(r.url, "?") {
		sep = "&"
	}
	return r.url + sep + "exchange=" + r.exchange
}

// record declares the recorder's queue and appends every delivery to
// r.delivered, in delivery order, until the test ends.
func (r *rabbit) record(t *testing.T) {
	t.Helper()
	conn, err := amqp091.Dial(r.url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		t.Fatal(err)
	}
	q := r.exchange + ".recorder"
	if err := ch.ExchangeDeclare(r.exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q, false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q, "#", r.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(q, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			var env struct {
				AggregateID      string `json:"aggregate_id"`
				AggregateVersion int64  `json:"aggregate_version"`
			}
			id, _ := uuid.Parse(m.MessageId)
			_ = json.Unmarshal(m.Body, &env)
			d := delivered{id: id, key: env.AggregateID, version: env.AggregateVersion}
			// A database that is away (a test stops it) tells nothing.
			qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			r.mu.Lock()
			lookup := r.seen
			r.mu.Unlock()
			seen, err := lookup(qctx, id)
			cancel()
			d.unseen = err == nil && !seen
			r.mu.Lock()
			r.delivered = append(r.delivered, d)
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = conn.Close()
		<-done
	})
	t.Cleanup(func() {
		// The exchange is the test's own; its queues are exclusive.
		if c, err := amqp091.Dial(r.url); err == nil {
			if ch, err := c.Channel(); err == nil {
				_, _ = ch.QueueDelete(r.exchange+".stock", false, false, false)
				_ = ch.ExchangeDelete(r.exchange, false, false)
			}
			_ = c.Close()
		}
	})
}

// waitRecorded waits until the recorder got every one of n distinct
// events. It looks each delivery's business row up, one query at a time:
// on a loaded machine that takes longer than the consumer's batches.
func (r *rabbit) waitRecorded(t *testing.T, n int, within time.Duration) {
	t.Helper()
	testsvc.WaitFor(t, within, fmt.Sprintf("%d events delivered to the recorder", n), func() bool {
		seen := map[uuid.UUID]bool{}
		for _, d := range r.deliveries() {
			seen[d.id] = true
		}
		return len(seen) >= n
	})
}

func (r *rabbit) deliveries() []delivered {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.delivered)
}

// checkDelivered checks what the broker delivered: every event of want at
// least once, the first copy of each aggregate's events in version order
// (copies published again after a crash come after it), and none before
// the business row committed with it was visible. It returns how many
// messages were delivered more than once.
func checkDelivered(t *testing.T, got []delivered, want []idemmsg.Message) (duplicates int) {
	t.Helper()
	seen := map[uuid.UUID]bool{}
	last := map[string]int64{}
	unseen := 0
	for _, d := range got {
		if d.unseen {
			unseen++
		}
		if seen[d.id] {
			duplicates++
			continue
		}
		seen[d.id] = true
		if d.version <= last[d.key] {
			t.Errorf("aggregate %s: version %d delivered first after version %d", d.key, d.version, last[d.key])
		}
		last[d.key] = d.version
	}
	if unseen > 0 {
		t.Errorf("%d deliveries arrived before the business row committed with their event was visible", unseen)
	}
	missing := 0
	for _, m := range want {
		if !seen[m.EventID] {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d events never delivered", missing, len(want))
	}
	return duplicates
}

// writeLoad writes aggregates x perAggregate events (aggregates
// <prefix>-0...) (versions 1..perAggregate)
// from writers concurrent writers, five events per transaction, each
// with its row in the table business. Each
// aggregate belongs to one writer, so its events commit in version order.
// Every other transaction of a writer goes through a WAL-message writer
// (outbox.NewLogWriter) when logMessages is set, the others as table rows.
// It returns the events in a per-aggregate commit order, as messages (key =
// aggregate id).
func writeLoad(ctx context.Context, pg *testdb.PG, prefix string, writers, aggregates, perAggregate int, logMessages bool) ([]idemmsg.Message, error) {
	if _, err := pg.Pool.Exec(ctx, businessTable); err != nil {
		return nil, err
	}
	rows := outbox.NewWriter(pg.Driver)
	logs := rows
	if logMessages {
		var err error
		if logs, err = outbox.NewLogWriter(pg.Driver, cdcPrefix(pg)); err != nil {
			return nil, err
		}
	}
	out := make([][]idemmsg.Message, writers)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			var mine []string
			for a := w; a < aggregates; a += writers {
				mine = append(mine, fmt.Sprintf("%s-%d", prefix, a))
			}
			tx := 0
			for v := 1; v <= perAggregate; v++ {
				for start := 0; start < len(mine); start += 5 {
					var evs []idemmsg.Event
					for _, agg := range mine[start:min(start+5, len(mine))] {
						ev, err := idemmsg.NewEvent("order.order.changed.v1", "order", agg, map[string]any{"aggregate": agg, "version": v})
						if err != nil {
							errs <- err
							return
						}
						ev.AggregateVersion = int64(v)
						evs = append(evs, ev)
					}
					wr := rows
					if tx%2 == 1 {
						wr = logs
					}
					tx++
					ids := make([]uuid.UUID, len(evs))
					for i, ev := range evs {
						ids[i] = ev.ID
					}
					err := pgx.BeginFunc(ctx, pg.Pool, func(t pgx.Tx) error {
						if _, err := t.Exec(ctx, `INSERT INTO business SELECT unnest($1::uuid[])`, ids); err != nil {
							return err
						}
						return wr.Add(ctx, t, evs...)
					})
					if err != nil {
						errs <- fmt.Errorf("writer %d: %w", w, err)
						return
					}
					for _, ev := range evs {
						out[w] = append(out[w], idemmsg.Message{EventID: ev.ID, Key: []byte(ev.AggregateID)})
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	var all []idemmsg.Message
	for _, m := range out {
		all = append(all, m...)
	}
	return all, nil
}

// applied counts the distinct events the consumer applied.
func applied(t *testing.T, pg *testdb.PG) int {
	t.Helper()
	var n int
	if err := pg.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT event_id) FROM effect WHERE consumer = 'stock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCDCKilledAtFaultPoints kills "idem cdc" with SIGKILL at each of its
// fault points while 8 writers commit 10,000 events over 1,000 aggregates
// (half the transactions as table rows, half as WAL messages), restarts it,
// and checks: every event delivered by RabbitMQ at least once, the first
// copy of each aggregate's events in commit order, each applied once by an
// idempotent consumer on PostgreSQL, in order, and the outbox emptied.
func TestCDCKilledAtFaultPoints(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		point string
		// nth is the hit of the point that kills: far enough into the run
		// that the relay has published and confirmed some of it, and near
		// enough that a loaded machine, whose relay confirms fewer, larger
		// batches (a position moves once per flush), still reaches it.
		nth int
		// republishes: the killed relay had published what it had not
		// confirmed, which the restarted one publishes again.
		republishes bool
	}{
		{fault.CDCAfterReceive, 200, false},
		{fault.CDCAfterPublishBeforeConfirm, 6, true},
		{fault.CDCAfterConfirm, 5, false},
	} {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			pg := testdb.NewPostgres(t, testdb.Options{MaxConns: 20})
			dropSlotAtCleanup(t, pg)
			rb := newRabbit(t, pg, testamqp.URL(t))

			p := startCDC(t, "armed", pg, rb.brokerURL(), fmt.Sprintf("%s@%d", tc.point, tc.nth))
			p.waitStreaming(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			type result struct {
				msgs []idemmsg.Message
				err  error
			}
			written := make(chan result, 1)
			go func() {
				msgs, err := writeLoad(ctx, pg, "agg", 8, 1000, 10, true)
				written <- result{msgs, err}
			}()
			p.waitFault(t, 90*time.Second)
			before := len(rb.deliveries())
			if tc.point != fault.CDCAfterReceive && before == 0 {
				t.Errorf("the relay killed at %s had delivered nothing", tc.point)
			}
			// Killed after archiving a batch and before confirming its
			// position: the next relay publishes it again, and must not
			// archive it twice (checkArchived).
			if n := len(pgArchive(t, pg)); tc.republishes && n == 0 {
				t.Errorf("the relay killed at %s had archived nothing", tc.point)
			}

			p2 := startCDC(t, "restarted", pg, rb.brokerURL(), "")
			res := <-written
			if res.err != nil {
				t.Fatal(res.err)
			}
			if len(res.msgs) != 10000 {
				t.Fatalf("%d events written, want 10000", len(res.msgs))
			}
			testsvc.WaitFor(t, 90*time.Second, "10,000 events applied", func() bool { return applied(t, pg) >= len(res.msgs) })
			rb.waitRecorded(t, len(res.msgs), 120*time.Second)
			checkEmptied(t, pg, rb)
			p2.stop(t)

			dups := checkDelivered(t, rb.deliveries(), res.msgs)
			brokertest.CheckOnceInOrder(t, pg, "stock", res.msgs)
			checkArchived(t, res.msgs, func() []archivedRow { return pgArchive(t, pg) })
			st := rb.consumer.Stats()
			t.Logf("%s@%d: %d delivered before the kill; %d deliveries in all, %d copies; consumer applied %d, skipped %d duplicates",
				tc.point, tc.nth, before, len(rb.deliveries()), dups, st.Applied, st.Duplicates)
			if tc.republishes && dups == 0 {
				t.Errorf("killed at %s, nothing was published twice: the fault point was not between the broker's confirm and the slot's", tc.point)
			}
		})
	}
}

// archivedRow is an event of the outbox's archive.
type archivedRow struct {
	id, aggregate string
	version       int64
}

// pgArchive returns pg's archive in its seq order: the order in which a
// replay publishes it.
func pgArchive(t *testing.T, pg *testdb.PG) []archivedRow {
	t.Helper()
	rows, err := pg.Pool.Query(context.Background(), `SELECT id, aggregateid, aggregate_version FROM outbox_archive ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []archivedRow
	for rows.Next() {
		var r archivedRow
		if err := rows.Scan(&r.id, &r.aggregate, &r.version); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkArchived waits until the archive holds as many events as want (the
// relay archives WAL messages, which leave no row, once their position is
// confirmed), then checks that it holds each event of want once, after a
// relay was killed between publishing and confirming, and each aggregate's
// in version order: a replay publishes every event once, in order.
func checkArchived(t *testing.T, want []idemmsg.Message, archive func() []archivedRow) {
	t.Helper()
	var got []archivedRow
	testsvc.WaitFor(t, 30*time.Second, "every event archived", func() bool {
		got = archive()
		return len(got) >= len(want)
	})
	if len(got) != len(want) {
		t.Errorf("the archive holds %d events, want %d", len(got), len(want))
	}
	seen := map[string]int{}
	last := map[string]int64{}
	for _, r := range got {
		seen[r.id]++
		if r.version <= last[r.aggregate] {
			t.Errorf("archive: aggregate %s version %d after %d", r.aggregate, r.version, last[r.aggregate])
		}
		last[r.aggregate] = r.version
	}
	for _, m := range want {
		if seen[m.EventID.String()] != 1 {
			t.Errorf("event %s archived %d times, want once", m.EventID, seen[m.EventID.String()])
		}
	}
}

// checkEmptied waits until the relay deleted every row it published, and
// otherwise says which rows stay and how many times each was delivered.
func checkEmptied(t *testing.T, pg *testdb.PG, rb *rabbit) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for pg.Count(t, "outbox") != 0 {
		if time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		rows, err := pg.Pool.Query(context.Background(), `SELECT id, seq, aggregateid, aggregate_version FROM outbox ORDER BY seq LIMIT 20`)
		if err != nil {
			t.Fatal(err)
		}
		delivered := map[uuid.UUID]int{}
		for _, d := range rb.deliveries() {
			delivered[d.id]++
		}
		var left []string
		for rows.Next() {
			var id uuid.UUID
			var seq, version int64
			var agg string
			if err := rows.Scan(&id, &seq, &agg, &version); err != nil {
				t.Fatal(err)
			}
			left = append(left, fmt.Sprintf("seq %d %s v%d delivered %d times", seq, agg, version, delivered[id]))
		}
		t.Fatalf("%d rows still in the outbox after 30s; the first: %s", pg.Count(t, "outbox"), strings.Join(left, "; "))
	}
}

// TestCDCSurvivesPostgresRestart stops and starts PostgreSQL while "idem
// cdc" runs: it resumes from its slot by itself, nothing is lost, each
// event is applied once, in order.
func TestCDCSurvivesPostgresRestart(t *testing.T) {
	testdb.PostgresExclusive(t)
	pg := testdb.NewPostgres(t, testdb.Options{MaxConns: 20})
	dropSlotAtCleanup(t, pg)
	rb := newRabbit(t, pg, testamqp.URL(t))
	p := startCDC(t, "cdc", pg, rb.brokerURL(), "")
	p.waitStreaming(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	first, err := writeLoad(ctx, pg, "before", 4, 200, 5, true)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 60*time.Second, "the first 1,000 events applied", func() bool { return applied(t, pg) >= len(first) })
	// Stopped at once, while the relay may still have published rows to
	// delete: a fast shutdown waits for the walsender to see everything it
	// sent confirmed, and the relay confirms a position only once its rows
	// are deleted, which the stopping server refuses; the relay must leave
	// the stream rather than hold the shutdown.
	logged := len(p.out.String())
	testdb.StopPostgres(t)
	// The relay meets a server that is away: its stream drops, and it goes
	// on once the server has refused a reconnection.
	testsvc.WaitFor(t, 60*time.Second, "idem cdc logging a reconnection the stopped server refused", func() bool {
		if p.exited() {
			t.Fatalf("idem cdc exited while PostgreSQL was down:\n%s", tail(p.out.String(), 4000))
		}
		for _, line := range strings.Split(p.out.String()[logged:], "\n") {
			if strings.Contains(line, "replication stopped; reconnecting") && strings.Contains(line, "connection refused") {
				t.Logf("idem cdc: %s", line)
				return true
			}
		}
		return false
	})
	testdb.StartPostgres(t)

	second, err := writeLoad(ctx, pg, "after", 4, 200, 5, true)
	if err != nil {
		t.Fatal(err)
	}
	all := append(first, second...)
	testsvc.WaitFor(t, 90*time.Second, "2,000 events applied after the restart", func() bool {
		if p.exited() {
			t.Fatalf("idem cdc exited:\n%s", tail(p.out.String(), 4000))
		}
		return applied(t, pg) >= len(all)
	})
	checkEmptied(t, pg, rb)
	p.stop(t)
	brokertest.CheckOnceInOrder(t, pg, "stock", all)
}

// hook is an HTTP endpoint receiving the webhook publisher's batches: a
// broker whose deliveries tell which process published them.
type hook struct {
	srv  *httptest.Server
	mu   sync.Mutex
	msgs []webhook.Message
}

func newHook(t *testing.T) *hook {
	t.Helper()
	h := &hook{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req webhook.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		h.msgs = append(h.msgs, req.Messages...)
		h.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) url() string { return h.srv.URL + "/events" }

func (h *hook) messages() []webhook.Message {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.msgs)
}

// ids returns the distinct event ids received.
func (h *hook) ids() map[uuid.UUID]bool {
	out := map[uuid.UUID]bool{}
	for _, m := range h.messages() {
		out[m.EventID] = true
	}
	return out
}

// psql runs the PostgreSQL package's psql on the test server with
// search_path set to pg's schema: a program that knows nothing of idem.
func psql(t *testing.T, pg *testdb.PG, sql string) {
	t.Helper()
	bindir := os.Getenv("IDEM_TEST_POSTGRES_BINDIR")
	if bindir == "" {
		t.Fatal("IDEM_TEST_POSTGRES_BINDIR is not set: run the tests with `make test`, which starts a private PostgreSQL server and exports where its binaries are")
	}
	cmd := exec.Command(filepath.Join(bindir, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", testdb.PostgresURL(t), "-c", sql)
	cmd.Env = append(os.Environ(), "PGOPTIONS=-csearch_path="+pg.Schema)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
}

// TestCDCPublishesRowsFromPsql: rows inserted by psql with only Debezium's
// five columns (id, aggregatetype, aggregateid, type, payload) are
// published as idem's own: event id, name, key, aggregate type and
// payload; a rolled-back insert publishes nothing.
func TestCDCPublishesRowsFromPsql(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	dropSlotAtCleanup(t, pg)
	h := newHook(t)
	p := startCDC(t, "cdc", pg, h.url(), "")
	ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.New(), uuid.New()}
	insert := func(id uuid.UUID, agg string, n int) string {
		return fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('%s', 'customer', '%s', 'crm.customer.moved.v1', '{"street": "rue %d"}');`, id, agg, n)
	}
	// Once the relay reads its slot, write as another program would.
	p.waitStreaming(t)
	psql(t, pg, "BEGIN; "+insert(ids[0], "c-1", 1)+insert(ids[1], "c-1", 2)+" COMMIT;")
	psql(t, pg, "BEGIN; "+insert(ids[2], "c-2", 3)+" ROLLBACK;")
	psql(t, pg, insert(ids[3], "c-2", 4))
	testsvc.WaitFor(t, 30*time.Second, "the committed rows published", func() bool {
		got := h.ids()
		return got[ids[0]] && got[ids[1]] && got[ids[3]]
	})
	p.stop(t)
	var order []uuid.UUID
	for _, m := range h.messages() {
		if m.EventID == ids[2] {
			t.Fatalf("the rolled-back row %s was published", ids[2])
		}
		if !slices.Contains(order, m.EventID) {
			order = append(order, m.EventID)
		}
		if m.EventName != "crm.customer.moved.v1" || m.AggregateType != "customer" {
			t.Errorf("message %s: name %q, aggregate type %q", m.EventID, m.EventName, m.AggregateType)
		}
		ev, err := idemmsg.Decode(idemmsg.Message{EventID: m.EventID, EventName: m.EventName, AggregateType: m.AggregateType, Key: m.Key, Headers: m.Headers, Body: m.Body})
		if err != nil {
			t.Errorf("message %s: %v\n%s", m.EventID, err, m.Body)
			continue
		}
		wantAgg := map[uuid.UUID]string{ids[0]: "c-1", ids[1]: "c-1", ids[3]: "c-2"}[m.EventID]
		if ev.ID != m.EventID || ev.AggregateID != wantAgg || string(m.Key) != wantAgg || !strings.Contains(string(ev.Payload), `"street"`) {
			t.Errorf("message %s decoded as %+v (key %q)", m.EventID, ev, m.Key)
		}
	}
	if !slices.Equal(order, []uuid.UUID{ids[0], ids[1], ids[3]}) {
		t.Errorf("published in the order %v, want %v", order, []uuid.UUID{ids[0], ids[1], ids[3]})
	}
}

// TestCDCTwoProcessesOneSlot: a second "idem cdc" on the same slot waits
// while the first publishes; SIGKILLed, the first is replaced by the second,
// which publishes everything that follows.
func TestCDCTwoProcessesOneSlot(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t, testdb.Options{MaxConns: 20})
	dropSlotAtCleanup(t, pg)
	h1, h2 := newHook(t), newHook(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	first := startCDC(t, "first", pg, h1.url(), "")
	first.waitStreaming(t)
	second := startCDC(t, "second", pg, h2.url(), "")
	batch1, err := writeLoad(ctx, pg, "a", 4, 100, 5, true)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 60*time.Second, "the first batch published by the first process", func() bool {
		got := h1.ids()
		for _, m := range batch1 {
			if !got[m.EventID] {
				return false
			}
		}
		return true
	})
	if n := len(h2.messages()); n != 0 {
		t.Fatalf("the second process published %d messages while the first held the slot", n)
	}
	if second.exited() {
		t.Fatalf("the second process exited instead of waiting for the slot:\n%s", tail(second.out.String(), 4000))
	}

	first.kill()
	batch2, err := writeLoad(ctx, pg, "b", 4, 100, 5, true)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 60*time.Second, "the second batch published by the second process", func() bool {
		got := h2.ids()
		for _, m := range batch2 {
			if !got[m.EventID] {
				return false
			}
		}
		return true
	})
	second.stop(t)
	// Together they published everything; the second in per-aggregate
	// order (its first copies).
	all := h1.ids()
	for id := range h2.ids() {
		all[id] = true
	}
	for _, m := range append(batch1, batch2...) {
		if !all[m.EventID] {
			t.Errorf("event %s never published", m.EventID)
		}
	}
	var got []delivered
	for _, m := range h2.messages() {
		var env struct {
			AggregateID      string `json:"aggregate_id"`
			AggregateVersion int64  `json:"aggregate_version"`
		}
		if err := json.Unmarshal(m.Body, &env); err != nil {
			t.Fatal(err)
		}
		got = append(got, delivered{id: m.EventID, key: env.AggregateID, version: env.AggregateVersion})
	}
	checkDelivered(t, got, batch2)
}
