package brokertest

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testlog"
)

// effectTable is the table EffectConsumer's handler writes to: one row per
// application of an event, in application order, with no unique key, so
// that a double effect shows.
const effectTable = `CREATE TABLE IF NOT EXISTS effect (
	seq bigserial PRIMARY KEY,
	event_id uuid NOT NULL,
	consumer text NOT NULL,
	aggregate_id text NOT NULL)`

// EffectConsumer returns an idempotent consumer on drv, configured by cfg
// (its Logger defaults to LogTo(t)), with one handler for every event: it
// calls fail, if set, and returns its error, or inserts a row (event_id,
// consumer, aggregate_id) into the table effect, created if needed. The table has no unique key: an
// event applied twice has two rows (CheckOnceInOrder).
func EffectConsumer(t testing.TB, drv *postgres.PgxDriver, cfg inbox.Config, fail func(idem.Event) error) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = LogTo(t)
	}
	c, err := effectConsumer(drv, cfg, fail)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func effectConsumer(drv *postgres.PgxDriver, cfg inbox.Config, fail func(idem.Event) error) (*inbox.Consumer[pgx.Tx], error) {
	if _, err := drv.Pgx().Exec(context.Background(), effectTable); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = Logger()
	}
	c, err := inbox.New[pgx.Tx](drv, cfg)
	if err != nil {
		return nil, err
	}
	name := cfg.Name
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		if fail != nil {
			if err := fail(ev); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, consumer, aggregate_id) VALUES ($1, $2, $3)`, ev.ID, name, ev.AggregateID)
		return err
	})
	return c, nil
}

// Logger returns a logger that writes nothing, for what a test builds
// where it has no testing.TB at hand. Where it has one, LogTo is better.
func Logger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// LogTo returns a logger writing to t's output, as t.Log does: the lines of
// the services a test starts show with the test when it fails, or under go
// test -v, and nowhere else. Give it to the subscribers Instance.NewSubscriber
// returns.
func LogTo(t testing.TB) *slog.Logger { return testlog.New(t) }

// CheckOnceInOrder checks the effects EffectConsumer wrote for consumer:
// every message of msgs applied exactly once, nothing else applied, and the
// messages of each key applied in the order they have in msgs.
func CheckOnceInOrder(t testing.TB, pg *testdb.PG, consumer string, msgs []idem.Message) {
	t.Helper()
	rows, err := pg.Pool.Query(context.Background(),
		`SELECT event_id::text, aggregate_id FROM effect WHERE consumer = $1 ORDER BY seq`, consumer)
	if err != nil {
		t.Fatal(err)
	}
	type effect struct{ id, key string }
	effects, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effect, error) {
		var e effect
		return e, r.Scan(&e.id, &e.key)
	})
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]int{}
	order := map[string][]string{}
	for _, e := range effects {
		applied[e.id]++
		order[e.key] = append(order[e.key], e.id)
	}
	want := map[string][]string{}
	for _, m := range msgs {
		id := m.EventID.String()
		if n := applied[id]; n != 1 {
			t.Errorf("%s: event %s (key %s) applied %d times, want 1", consumer, id, m.Key, n)
		}
		want[string(m.Key)] = append(want[string(m.Key)], id)
	}
	if len(applied) != len(msgs) {
		t.Errorf("%s: %d distinct events applied, want %d", consumer, len(applied), len(msgs))
	}
	for key, ids := range want {
		if got := order[key]; len(got) == len(ids) && !slices.Equal(got, ids) {
			t.Errorf("%s: the events of key %s applied in the order %v, want %v", consumer, key, got, ids)
		}
	}
}
