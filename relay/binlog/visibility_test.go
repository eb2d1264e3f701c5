package binlog_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/internal/logengine/logenginetest"
)

// readingPublisher stands for a consumer that reads the producer's
// database when an event arrives: before each Publish call, it looks for
// the business rows of the events in a session of its own, and records
// the events whose row it cannot see. Then it publishes to a memory
// publisher.
type readingPublisher struct {
	*memory.Publisher
	db *testdb.SQLDB

	mu      sync.Mutex
	missing []uuid.UUID
}

func (p *readingPublisher) Publish(ctx context.Context, msgs []idem.Message) error {
	for _, m := range msgs {
		var n int
		if err := p.db.DB.QueryRowContext(ctx, `SELECT count(*) FROM business WHERE event_id = ?`, m.EventID.String()).Scan(&n); err != nil {
			return err // a fault: the relay publishes them again
		}
		if n == 0 {
			p.mu.Lock()
			p.missing = append(p.missing, m.EventID)
			p.mu.Unlock()
		}
	}
	return p.Publisher.Publish(ctx, msgs)
}

// TestNothingPublishedBeforeCommitted holds a transaction in the moment
// when the binary log has it, and gives it to the relay, and InnoDB has
// not committed it: on a server of the test's own, a semi-synchronous
// replica that never answers keeps the committing session waiting after
// the binary log is synced (rpl_semi_sync_master_wait_point AFTER_SYNC)
// until the wait's timeout, 4 s. The relay must not publish its event
// before the commit (its locking read waits for it), so that a consumer
// that reads the producer's database on each message finds every row.
// Without the locking read (the mutant cdc.skip-visibility, build tag
// idemmutant) the event is published during the wait and the test fails.
func TestNothingPublishedBeforeCommitted(t *testing.T) {
	t.Parallel()
	srv := testdb.StartMariaDB(t, testdb.SharedBinlog...)
	db := srv.NewDB(t)
	db.Exec(t, `CREATE TABLE business (event_id VARCHAR(36) PRIMARY KEY)`)
	pub := &readingPublisher{Publisher: memory.New(), db: db}
	start(t, db, pub, fastConfig(t))
	w := outbox.NewWriter(db.Driver)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	write := func(v int) (uuid.UUID, error) {
		ev, err := idem.NewEvent("order.changed.v1", "order", "1", map[string]any{"version": v})
		if err != nil {
			return uuid.Nil, err
		}
		ev.AggregateVersion = int64(v)
		tx, err := db.DB.BeginTx(ctx, nil)
		if err != nil {
			return uuid.Nil, err
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, `INSERT INTO business (event_id) VALUES (?)`, ev.ID.String()); err != nil {
			return uuid.Nil, err
		}
		if err := w.Add(ctx, tx, ev); err != nil {
			return uuid.Nil, err
		}
		return ev.ID, tx.Commit()
	}
	first, err := write(1)
	if err != nil {
		t.Fatal(err)
	}
	waitLen(t, pub.Publisher, 1)

	// Every commit now waits, after its binlog sync, for a replica that
	// never answers: 4 s, then the server gives up and commits.
	admin, err := mysql.Open(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, q := range []string{`SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC`, `SET GLOBAL rpl_semi_sync_master_wait_no_slave = ON`,
		`SET GLOBAL rpl_semi_sync_master_timeout = 4000`, `SET GLOBAL rpl_semi_sync_master_enabled = ON`} {
		if _, err := admin.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	began := time.Now()
	held, err := write(2)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(began); waited < 3*time.Second {
		t.Fatalf("the held commit took %v: the server did not wait for its replica, and the test shows nothing", waited)
	}
	if _, err := admin.ExecContext(ctx, `SET GLOBAL rpl_semi_sync_master_enabled = OFF`); err != nil {
		t.Fatal(err)
	}
	later, err := write(3)
	if err != nil {
		t.Fatal(err)
	}
	logenginetest.CheckFirstOrder(t, waitLen(t, pub.Publisher, 3), []uuid.UUID{first, held, later})
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if len(pub.missing) > 0 {
		t.Errorf("events published before their transaction was committed (their business row not visible): %v", pub.missing)
	}
}
