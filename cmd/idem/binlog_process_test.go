package main

// Process tests of "idem cdc" on MariaDB (the binlog relay): the command
// built with fault points, run as a child process against the test MariaDB
// (binary log in row format) and RabbitMQ, killed with SIGKILL at its fault
// points, and checked through a real idempotent consumer (on PostgreSQL)
// and what the broker delivered.

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
)

// startBinlog starts "idem cdc" on db's outbox publishing to brokerURL,
// with the fault point armed when point is set.
func startBinlog(t *testing.T, name string, db *testdb.SQLDB, brokerURL, point string) *cdcProc {
	t.Helper()
	return startProc(t, name, []string{fault.EnvVar + "=" + point}, "cdc", "--db", db.URL, "--broker", brokerURL, "--metrics-addr", "", "--log-level", "debug")
}

// newMariaRabbit is newRabbit for a producer on MariaDB (or SQLite: any
// database/sql one with ? placeholders): the recorder looks each
// delivery's business row up there.
func newMariaRabbit(t *testing.T, db *testdb.SQLDB) *rabbit {
	t.Helper()
	db.Exec(t, `CREATE TABLE IF NOT EXISTS business (event_id CHAR(36) PRIMARY KEY)`)
	pg := testdb.NewPostgres(t, testdb.Options{MaxConns: 20})
	rb := newRabbit(t, pg, testamqp.URL(t))
	rb.mu.Lock()
	rb.seen = func(ctx context.Context, id uuid.UUID) (bool, error) {
		var n int
		err := db.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM business WHERE event_id = ?`, id.String()).Scan(&n)
		return n == 1, err
	}
	rb.mu.Unlock()
	return rb
}

// writeMariaLoad is writeLoad on MariaDB (or SQLite): aggregates x
// perAggregate events from writers concurrent writers, five events per
// transaction, each with its row in the table business, every aggregate's
// events committed in version order by one writer.
func writeMariaLoad(ctx context.Context, db *testdb.SQLDB, prefix string, writers, aggregates, perAggregate int) ([]idemmsg.Message, error) {
	w := outbox.NewWriter(db.Driver)
	out := make([][]idemmsg.Message, writers)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for n := range writers {
		wg.Go(func() {
			var mine []string
			for a := n; a < aggregates; a += writers {
				mine = append(mine, fmt.Sprintf("%s-%d", prefix, a))
			}
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
					err := inTx(ctx, db.DB, func(tx *sql.Tx) error {
						for _, ev := range evs {
							if _, err := tx.ExecContext(ctx, `INSERT INTO business VALUES (?)`, ev.ID.String()); err != nil {
								return err
							}
						}
						return w.Add(ctx, tx, evs...)
					})
					if err != nil {
						errs <- fmt.Errorf("writer %d: %w", n, err)
						return
					}
					for _, ev := range evs {
						out[n] = append(out[n], idemmsg.Message{EventID: ev.ID, Key: []byte(ev.AggregateID)})
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

func inTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// TestBinlogKilledAtFaultPoints kills "idem cdc" on MariaDB with SIGKILL at
// each of its fault points while 8 writers commit 10,000 events over 1,000
// aggregates, restarts it, and checks: every event delivered by RabbitMQ at
// least once, none before its transaction was visible, the first copy of
// each aggregate's events in commit order, each applied once by an
// idempotent consumer, in order, and the outbox emptied.
func TestBinlogKilledAtFaultPoints(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		point       string
		nth         int
		republishes bool
	}{
		{fault.CDCAfterReceive, 200, false},
		{fault.CDCAfterPublishBeforeConfirm, 6, true},
		{fault.CDCAfterConfirm, 5, false},
	} {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			db := testdb.NewMariaDB(t, testdb.Options{MaxConns: 20})
			rb := newMariaRabbit(t, db)

			p := startBinlog(t, "armed", db, rb.brokerURL(), fmt.Sprintf("%s@%d", tc.point, tc.nth))
			p.waitStreaming(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			type result struct {
				msgs []idemmsg.Message
				err  error
			}
			written := make(chan result, 1)
			go func() {
				msgs, err := writeMariaLoad(ctx, db, "agg", 8, 1000, 10)
				written <- result{msgs, err}
			}()
			p.waitFault(t, 120*time.Second)
			before := len(rb.deliveries())
			if tc.point != fault.CDCAfterReceive && before == 0 {
				t.Errorf("the relay killed at %s had delivered nothing", tc.point)
			}
			// Killed after archiving a batch and before confirming its
			// position: the next relay publishes it again, and must not
			// archive it twice (checkArchived).
			if n := len(mariaArchive(t, db)); tc.republishes && n == 0 {
				t.Errorf("the relay killed at %s had archived nothing", tc.point)
			}

			p2 := startBinlog(t, "restarted", db, rb.brokerURL(), "")
			res := <-written
			if res.err != nil {
				t.Fatal(res.err)
			}
			if len(res.msgs) != 10000 {
				t.Fatalf("%d events written, want 10000", len(res.msgs))
			}
			testsvc.WaitFor(t, 120*time.Second, "10,000 events applied", func() bool { return applied(t, rb.pg) >= len(res.msgs) })
			rb.waitRecorded(t, len(res.msgs), 120*time.Second)
			testsvc.WaitFor(t, 30*time.Second, "the outbox emptied", func() bool { return db.Count(t, "outbox") == 0 })
			p2.stop(t)

			dups := checkDelivered(t, rb.deliveries(), res.msgs)
			brokertest.CheckOnceInOrder(t, rb.pg, "stock", res.msgs)
			checkArchived(t, res.msgs, func() []archivedRow { return mariaArchive(t, db) })
			st := rb.consumer.Stats()
			t.Logf("%s@%d: %d delivered before the kill; %d deliveries in all, %d copies; consumer applied %d, skipped %d duplicates",
				tc.point, tc.nth, before, len(rb.deliveries()), dups, st.Applied, st.Duplicates)
			if tc.republishes && dups == 0 {
				t.Errorf("killed at %s, nothing was published twice: the fault point was not between the broker's confirm and the stored position", tc.point)
			}
		})
	}
}

// TestBinlogSurvivesMariaDBRestart stops and starts MariaDB while "idem
// cdc" reads its binlog: it resumes from its stored position by itself,
// nothing is lost, each event is applied once, in order.
func TestBinlogSurvivesMariaDBRestart(t *testing.T) {
	testdb.MariaDBExclusive(t)
	db := testdb.NewMariaDB(t, testdb.Options{MaxConns: 20})
	rb := newMariaRabbit(t, db)
	p := startBinlog(t, "cdc", db, rb.brokerURL(), "")
	p.waitStreaming(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	first, err := writeMariaLoad(ctx, db, "before", 4, 200, 5)
	if err != nil {
		t.Fatal(err)
	}
	testdb.RestartMariaDB(t)
	second, err := writeMariaLoad(ctx, db, "after", 4, 200, 5)
	if err != nil {
		t.Fatal(err)
	}
	all := append(first, second...)
	testsvc.WaitFor(t, 120*time.Second, "every event applied", func() bool { return applied(t, rb.pg) >= len(all) })
	testsvc.WaitFor(t, 60*time.Second, "the outbox emptied", func() bool { return db.Count(t, "outbox") == 0 })
	rb.waitRecorded(t, len(all), 120*time.Second)
	if !strings.Contains(p.out.String(), "reconnecting") {
		t.Errorf("the relay never lost its connection: was MariaDB restarted?")
	}
	p.stop(t)
	checkDelivered(t, rb.deliveries(), all)
	brokertest.CheckOnceInOrder(t, rb.pg, "stock", all)
}

// TestBinlogStandbyTakesOver runs two "idem cdc" processes on one MariaDB
// outbox: one reads, the other waits; the first is SIGKILLed mid-stream and
// the second takes over from the stored position: every event delivered,
// applied once, in order.
func TestBinlogStandbyTakesOver(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t, testdb.Options{MaxConns: 20})
	rb := newMariaRabbit(t, db)
	active := startBinlog(t, "active", db, rb.brokerURL(), "")
	active.waitStreaming(t)
	standby := startBinlog(t, "standby", db, rb.brokerURL(), "")
	testsvc.WaitFor(t, 60*time.Second, "the second process waiting", func() bool {
		return strings.Contains(standby.out.String(), "waiting to take over")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	first, err := writeMariaLoad(ctx, db, "first", 4, 100, 5)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 60*time.Second, "some events applied", func() bool { return applied(t, rb.pg) > 0 })
	active.kill()
	second, err := writeMariaLoad(ctx, db, "second", 4, 100, 5)
	if err != nil {
		t.Fatal(err)
	}
	all := append(first, second...)
	testsvc.WaitFor(t, 120*time.Second, "every event applied", func() bool { return applied(t, rb.pg) >= len(all) })
	if !strings.Contains(standby.out.String(), "took the outbox's binlog over") {
		t.Errorf("the standby never said it took over:\n%s", tail(standby.out.String(), 4000))
	}
	rb.waitRecorded(t, len(all), 120*time.Second)
	standby.stop(t)
	checkDelivered(t, rb.deliveries(), all)
	brokertest.CheckOnceInOrder(t, rb.pg, "stock", all)
}

// mariaArchive returns db's archive in its seq order: the order in which a
// replay publishes it.
func mariaArchive(t *testing.T, db *testdb.SQLDB) []archivedRow {
	t.Helper()
	rows, err := db.DB.QueryContext(context.Background(), `SELECT id, aggregateid, aggregate_version FROM outbox_archive ORDER BY seq`)
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
