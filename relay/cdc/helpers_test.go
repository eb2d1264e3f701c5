package cdc_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/internal/logengine/logenginetest"
)

func testLogger(t testing.TB) *slog.Logger {
	if t != nil && testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// fastConfig returns a configuration with short delays for tests.
func fastConfig(t testing.TB) cdc.Config {
	return cdc.Config{
		StandbyInterval: time.Second,
		FlushInterval:   20 * time.Millisecond,
		PublishTimeout:  5 * time.Second,
		RetryBackoff:    10 * time.Millisecond,
		MaxRetryBackoff: 100 * time.Millisecond,
		Logger:          testLogger(t),
	}
}

// newDB returns a fresh schema whose slot and publication are dropped when
// the test ends (a slot keeps WAL for ever).
func newDB(t testing.TB) *testdb.PG {
	t.Helper()
	pg := testdb.NewPostgres(t, testdb.Options{MaxConns: 20})
	slot := cdc.SlotName(idem.Tables{Schema: pg.Schema})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cdc.DropSlot(ctx, pg.URL, slot); err != nil && !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("drop slot: %v", err)
		}
		if _, err := pg.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+postgres.QuoteIdent(slot)); err != nil {
			t.Errorf("drop publication: %v", err)
		}
	})
	return pg
}

// start starts a relay on pg and pub and stops it when the test ends.
func start(t testing.TB, pg *testdb.PG, pub broker.Publisher, cfg cdc.Config) *cdc.Relay {
	t.Helper()
	if cfg.Tables.Schema == "" {
		cfg.Tables.Schema = pg.Schema
	}
	if cfg.MessagePrefix == "" {
		// WAL messages are seen by every slot of the database: one prefix
		// per outbox.
		cfg.MessagePrefix = pg.Schema
	}
	r, err := cdc.New(pg.URL, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	logenginetest.Start(t, r)
	return r
}

// stop stops a relay, failing the test if it does not stop cleanly.
var stop = logenginetest.Stop

// event returns the version-th event of aggregate order/id.
func event(t testing.TB, id string, version int) idem.Event {
	t.Helper()
	ev, err := idem.NewEvent("order.order.changed.v1", "order", id, map[string]any{"version": version})
	if err != nil {
		t.Fatal(err)
	}
	ev.AggregateVersion = int64(version)
	return ev
}

func decode(t testing.TB, m idem.Message) idem.Event {
	t.Helper()
	ev, err := idem.Decode(m)
	if err != nil {
		t.Fatalf("decode %s: %v", m.Body, err)
	}
	return ev
}

func waitLen(t *testing.T, pub *memory.Publisher, n int, within time.Duration) []idem.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := pub.WaitLen(ctx, n); err != nil {
		t.Fatalf("waiting for %d messages, got %d: %v", n, pub.Len(), err)
	}
	return pub.Messages()
}

// eventually polls cond until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// confirmedLSN returns the slot's confirmed_flush_lsn.
func confirmedLSN(t *testing.T, pg *testdb.PG, slot string) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := pg.Pool.QueryRow(context.Background(), `SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// currentLSN returns the server's current WAL position.
func currentLSN(t *testing.T, pg *testdb.PG) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := pg.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// checkOrder checks that every aggregate's versions appear in increasing
// order among msgs (duplicates allowed: a version may come again, never an
// older one after a newer one was confirmed... except as a whole replay),
// and that every expected event is there.
func checkAll(t *testing.T, msgs []idem.Message, want map[uuid.UUID]bool) {
	t.Helper()
	got := map[uuid.UUID]bool{}
	for _, m := range msgs {
		got[m.EventID] = true
	}
	for id := range want {
		if !got[id] {
			t.Errorf("event %s never published", id)
		}
	}
}

// checkFirstOrder checks that the first publication of each aggregate's
// events follows their versions.
func checkFirstOrder(t *testing.T, msgs []idem.Message) {
	t.Helper()
	logenginetest.CheckFirstOrder(t, msgs, nil)
}
