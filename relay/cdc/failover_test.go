package cdc_test

import (
	"context"
	"errors"
	"strings"
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
	"github.com/idem-go/idem/relay/logrelay"
)

// failoverCluster is a primary and its standby of the test's own, migrated,
// with a pool on the multi-host URL.
type failoverCluster struct {
	primary, standby *testdb.Server
	url              string
	pool             *pgxpool.Pool
	drv              *postgres.PgxDriver
}

func newFailoverCluster(t *testing.T, mode testdb.Replication) *failoverCluster {
	t.Helper()
	c := &failoverCluster{primary: testdb.StartServer(t)}
	c.standby = c.primary.StartStandby(t, mode)
	c.url = testdb.MultiHostURL("postgres", c.primary, c.standby)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, c.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c.pool, c.drv = pool, postgres.NewPgx(pool)
	if _, err := migrate.New(c.drv).Up(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// write writes ev with w in a transaction of its own, again until it
// commits (through the failover), and reports whether it did before ctx
// ended.
func (c *failoverCluster) write(ctx context.Context, w *outbox.Writer[pgx.Tx], ev idem.Event) bool {
	for ctx.Err() == nil {
		// Bounded: a connection to a frozen server answers nothing.
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pgx.BeginFunc(actx, c.pool, func(tx pgx.Tx) error { return w.Add(actx, tx, ev) })
		cancel()
		if err == nil {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// failover kills the primary (or freezes it) and promotes the standby; it
// returns when the primary died.
func (c *failoverCluster) failover(t *testing.T, freeze bool) time.Time {
	t.Helper()
	if freeze {
		c.primary.Freeze(t)
	} else {
		c.primary.Kill(t)
	}
	killed := time.Now()
	c.standby.Promote(t)
	t.Logf("primary killed (frozen: %v), standby promoted in %v", freeze, time.Since(killed).Round(time.Millisecond))
	return killed
}

// published reports whether pub published the event id.
func published(pub *memory.Publisher, id uuid.UUID) bool {
	for _, m := range pub.Messages() {
		if m.EventID == id {
			return true
		}
	}
	return false
}

// TestSlotRecreatedAfterFailover: PostgreSQL 15 does not replicate logical
// slots, so the promoted standby has none. The relay, on a multi-host URL,
// finds its slot missing, creates it again and publishes the rows still in
// the table, then the stream: every event committed on the old primary
// (and left unpublished, the broker holding them at the kill) and on the
// new one is published. The primary is killed (its connections reset), or
// frozen (they stay open and silent, as in a partition): the relay takes a
// silent replication connection for dead.
func TestSlotRecreatedAfterFailover(t *testing.T) {
	t.Run("killed", func(t *testing.T) { slotRecreatedAfterFailover(t, false) })
	t.Run("frozen", func(t *testing.T) { slotRecreatedAfterFailover(t, true) })
}

func slotRecreatedAfterFailover(t *testing.T, freeze bool) {
	c := newFailoverCluster(t, testdb.Sync)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub := memory.New()
	cfg := fastConfig(t)
	cfg.Tables.Schema = "public"
	cfg.RowsOnly = true // the server has a standby: say the events are rows
	r, err := cdc.New(c.url, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(t, r) })
	w := outbox.NewWriter(c.drv)
	want := map[uuid.UUID]bool{}
	written := 0
	writeN := func(n int) {
		for range n {
			written++
			ev := event(t, string(rune('a'+written%20)), written)
			if !c.write(ctx, w, ev) {
				t.Fatal(ctx.Err())
			}
			want[ev.ID] = true
		}
	}
	writeN(50)
	waitLen(t, pub, 50, 30*time.Second)

	// The broker holds what comes next: committed rows wait in the table.
	hold := make(chan struct{})
	pub.SetFunc(func(int, []idem.Message) memory.Action { return memory.Action{Hang: hold} })
	writeN(100)
	killed := c.failover(t, freeze)
	promoted := time.Now()
	pub.SetFunc(nil)
	close(hold)
	first := event(t, "first-after", 1)
	if !c.write(ctx, w, first) {
		t.Fatal(ctx.Err())
	}
	want[first.ID] = true
	eventually(t, 60*time.Second, "the first event of the new primary published", func() bool { return published(pub, first.ID) })
	t.Logf("the first event written on the new primary published %v after the kill, %v after the promotion", time.Since(killed).Round(time.Millisecond), time.Since(promoted).Round(time.Millisecond))
	writeN(100)

	eventually(t, 60*time.Second, "every committed event published", func() bool {
		got := map[uuid.UUID]bool{}
		for _, m := range pub.Messages() {
			got[m.EventID] = true
		}
		for id := range want {
			if !got[id] {
				return false
			}
		}
		return true
	})
	checkAll(t, pub.Messages(), want)
	checkFirstOrder(t, pub.Messages())
	eventually(t, 30*time.Second, "the published rows deleted", func() bool {
		var n int
		return c.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n) == nil && n == 0
	})
	var slots int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, cdc.SlotName(cfg.Tables)).Scan(&slots); err != nil || slots != 1 {
		t.Fatalf("slot on the new primary: %d, %v", slots, err)
	}
	t.Logf("published %d messages for %d events", pub.Len(), len(want))
}

// TestFailoverLossRefused: on a server with a physical standby, before
// PostgreSQL 17, an outbox that may hold events existing only in the WAL
// would lose those not yet published at a failover. Start refuses, creating
// nothing; RowsOnly (every event a row) and AcceptFailoverLoss start. With
// AcceptFailoverLoss, the WAL messages written and not published before the
// failover are lost: the relay publishes the ones written after it, and
// never those (nor those written on the new primary before it created the
// slot again).
func TestFailoverLossRefused(t *testing.T) {
	c := newFailoverCluster(t, testdb.Async)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub := memory.New()
	cfg := fastConfig(t)
	cfg.Tables.Schema = "public"
	r, err := cdc.New(c.url, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Start(ctx)
	if !errors.Is(err, cdc.ErrFailoverLoss) || !strings.Contains(err.Error(), c.standby.Name) || !strings.Contains(err.Error(), "--rows-only") {
		t.Fatalf("Start on a server with a standby = %v, want ErrFailoverLoss naming the standby and what to do", err)
	}
	t.Logf("refused: %v", err)
	var slots int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'`).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("a refused start left %d slots (%v)", slots, err)
	}
	if _, err := cdc.New(c.url, pub, cdc.Config{RowsOnly: true, Delete: logrelay.KeepRows}); err == nil {
		t.Fatal("RowsOnly with KeepRows accepted")
	}
	ro := cfg
	ro.RowsOnly = true
	r, err = cdc.New(c.url, pub, ro)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatalf("Start with RowsOnly: %v", err)
	}
	stop(t, r)

	cfg.AcceptFailoverLoss = true
	r, err = cdc.New(c.url, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatalf("Start with AcceptFailoverLoss: %v", err)
	}
	t.Cleanup(func() { stop(t, r) })
	lw, err := outbox.NewLogWriter(c.drv, "")
	if err != nil {
		t.Fatal(err)
	}
	first := event(t, "1", 1)
	if !c.write(ctx, lw, first) {
		t.Fatal(ctx.Err())
	}
	waitLen(t, pub, 1, 30*time.Second)

	// WAL messages committed (and replicated: the loss is the slot's, not
	// the replication's) while the broker holds them.
	hold := make(chan struct{})
	pub.SetFunc(func(int, []idem.Message) memory.Action { return memory.Action{Hang: hold} })
	lost := map[uuid.UUID]bool{}
	for v := 2; v <= 21; v++ {
		ev := event(t, "1", v)
		if !c.write(ctx, lw, ev) {
			t.Fatal(ctx.Err())
		}
		lost[ev.ID] = true
	}
	var lsn string
	if err := c.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the standby replaying the WAL messages", func() bool {
		var ok bool
		conn, err := pgx.Connect(ctx, c.standby.URL)
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		return conn.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&ok) == nil && ok
	})
	_ = c.failover(t, false)
	pub.SetFunc(nil)
	close(hold)

	// The sentinel: written once the relay created the slot again on the
	// new primary (a WAL message written before, on the new primary too,
	// is lost as well), published once the relay streams the new slot,
	// which starts after the lost messages.
	eventually(t, 60*time.Second, "the slot created again on the new primary", func() bool {
		var n int
		return c.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, cdc.SlotName(cfg.Tables)).Scan(&n) == nil && n == 1
	})
	sentinel := event(t, "2", 1)
	if !c.write(ctx, lw, sentinel) {
		t.Fatal(ctx.Err())
	}
	eventually(t, 60*time.Second, "the event written after the failover published", func() bool { return published(pub, sentinel.ID) })
	for _, m := range pub.Messages() {
		if lost[m.EventID] {
			t.Errorf("event %s, written before the failover and held, was published: the test shows no loss", m.EventID)
		}
	}
	t.Logf("with AcceptFailoverLoss: %d WAL-message events committed before the failover and not published are lost; the relay went on with the new slot", len(lost))
}
