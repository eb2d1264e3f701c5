package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/drivertest"
	"github.com/idem-go/idem/driver/internal/sqltime"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T, o drivertest.Options) *drivertest.DB[*sql.Tx] {
		db := testdb.NewSQLite(t, testdb.Options{NoMigrate: o.NoMigrate})
		return &drivertest.DB[*sql.Tx]{
			Driver: db.Driver,
			Schema: "main",
			// SQLite names the key's columns, not the key.
			IsUniqueViolation: func(err error, table, _ string) bool {
				return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: "+table+".")
			},
			Features: drivertest.Features{
				TimeArg:       sqltime.Arg,
				DynamicTyping: true,
				SingleWriter:  true,
			},
		}
	})
}

func TestSchemaRefused(t *testing.T) {
	_, err := sqlite.NewDialect(idem.Tables{Schema: "shop"})
	if err == nil || !strings.Contains(err.Error(), "Schema") {
		t.Fatalf("err = %v, want a Tables.Schema error", err)
	}
}

// TestConcurrentUseIsNotLocked writes outbox rows and processes events from
// many goroutines of one process at once, with a relay-style claimer
// running: no operation fails with "database is locked".
func TestConcurrentUseIsNotLocked(t *testing.T) {
	t.Parallel()
	db := testdb.NewSQLite(t)
	db.Exec(t, `CREATE TABLE reservation (order_id TEXT NOT NULL, quantity INTEGER NOT NULL)`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := outbox.NewWriter(db.Driver)
	c, err := inbox.New(db.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO reservation (order_id, quantity) VALUES (?, 1)`, ev.AggregateID)
		return err
	})
	const workers, rounds = 16, 30
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for g := range workers {
		wg.Go(func() {
			for i := range rounds {
				ev, err := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(g, "-", i), map[string]int{"i": i})
				if err != nil {
					fail(err)
					return
				}
				tx, err := db.Driver.Begin(ctx)
				if err != nil {
					fail(err)
					continue
				}
				if err := w.Add(ctx, tx, ev); err != nil {
					_ = tx.Rollback()
					fail(err)
					continue
				}
				if err := tx.Commit(); err != nil {
					fail(err)
					continue
				}
				// Deliver every event twice, from two goroutines' turns.
				if _, err := c.Process(ctx, ev); err != nil {
					fail(err)
				}
				if res := c.ProcessBatch(ctx, []idem.Event{ev, ev}); res[0].Err != nil {
					fail(res[0].Err)
				}
				if _, err := db.Driver.Dialect().OutboxBacklog(ctx, db.Driver.Pool()); err != nil {
					fail(err)
				}
			}
		})
	}
	wg.Go(func() {
		d := db.Driver.Dialect()
		for claimed := 0; claimed < workers*rounds; {
			if ctx.Err() != nil {
				fail(ctx.Err())
				return
			}
			tx, err := db.Driver.Begin(ctx)
			if err != nil {
				fail(err)
				continue
			}
			owner := idem.NewEventID()
			rows, err := d.ClaimOutbox(ctx, db.Driver.Tx(tx), driver.ClaimParams{Owner: owner, Lease: time.Minute, Limit: 50, MaxPerAggregate: 10})
			if err != nil {
				_ = tx.Rollback()
				fail(err)
				continue
			}
			if err := tx.Commit(); err != nil {
				fail(err)
				continue
			}
			seqs := make([]int64, len(rows))
			for i, r := range rows {
				seqs[i] = r.Seq
			}
			if _, err := d.MarkPublished(ctx, db.Driver.Pool(), owner, seqs); err != nil {
				fail(err)
			}
			claimed += len(rows)
		}
	})
	wg.Wait()
	for _, err := range errs {
		if sqlite.IsBusy(err) {
			t.Errorf("database is locked: %v", err)
		} else {
			t.Errorf("error: %v", err)
		}
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	if n := db.Count(t, "reservation"); n != workers*rounds {
		t.Errorf("reservations = %d, want %d (one per event)", n, workers*rounds)
	}
	if n := db.Count(t, "outbox WHERE published_at IS NULL"); n != 0 {
		t.Errorf("unpublished rows = %d, want 0", n)
	}
}

// TestFailedMessageRebuild checks the table that migration 0007 rebuilds
// (SQLite cannot drop the unique key 0001 declared in CREATE TABLE): its
// indexes, and the key back once the migration is reverted.
func TestFailedMessageRebuild(t *testing.T) {
	t.Parallel()
	db := testdb.NewSQLite(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	indexes := func() string {
		t.Helper()
		rows, err := db.DB.QueryContext(ctx, `SELECT name FROM pragma_index_list('failed_message') ORDER BY name`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var names []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			names = append(names, n)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return strings.Join(names, " ")
	}
	const rebuilt = "failed_message_aggregate_idx failed_message_event_idx failed_message_failed_at_idx"
	if got := indexes(); got != rebuilt {
		t.Errorf("indexes of failed_message = %s, want %s", got, rebuilt)
	}
	var leftover int
	if err := db.DB.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE name LIKE 'failed_message_rebuild%'`).Scan(&leftover); err != nil || leftover != 0 {
		t.Errorf("objects left by the rebuild: %d, %v", leftover, err)
	}
	var unique int
	if err := db.DB.QueryRowContext(ctx, `SELECT count(*) FROM pragma_index_list('failed_message') WHERE "unique" = 1`).Scan(&unique); err != nil || unique != 0 {
		t.Errorf("unique indexes of failed_message after 0007: %d, %v; want none", unique, err)
	}

	steps := 0
	for _, m := range db.Driver.Dialect().Migrations() {
		if m.Version >= 7 {
			steps++
		}
	}
	if _, err := migrate.New(db.Driver).Down(ctx, steps); err != nil {
		t.Fatal(err)
	}
	const reverted = "failed_message_aggregate_idx failed_message_failed_at_idx sqlite_autoindex_failed_message_1"
	if got := indexes(); got != reverted {
		t.Errorf("indexes of failed_message after reverting 0007 = %s, want %s", got, reverted)
	}
}
