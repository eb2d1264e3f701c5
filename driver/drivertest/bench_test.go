package drivertest_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// BenchmarkDatabasesSideBySide measures, on PostgreSQL, MariaDB and SQLite in
// one run, with the same events (100 aggregates, a 200-byte payload) and the
// same code (database/sql drivers):
//
//	consume: Consumer.ProcessBatch, batches of 100, one worker, a handler
//	         inserting one row: events/s with deduplication;
//	relay:   a relay (default configuration, memory publisher) moving
//	         committed outbox rows: events/s from its start to the last row
//	         marked published.
//
// Each iteration runs every database in turn, so that they share the
// machine's noise. Run:
//
//	IDEM_TEST_SHELL=1 IDEM_TEST_SERVERS="postgres mariadb" IDEM_TEST_CMD='go test -run XXX -bench BenchmarkDatabasesSideBySide -benchtime 1x -count 5 ./driver/drivertest/' bash scripts/test.sh
func BenchmarkDatabasesSideBySide(b *testing.B) {
	const events = 5000
	type target struct {
		name string
		drv  *driver.SQLDriver
		// insert is the handler's statement, in the database's placeholders.
		insert string
	}
	pg := testdb.NewPostgres(b)
	maria := testdb.NewMariaDB(b)
	lite := testdb.NewSQLite(b)
	const insert = `INSERT INTO effect (event_id, order_id) VALUES (?, ?)`
	targets := []target{
		{"postgres", postgres.NewSQL(pg.DB), `INSERT INTO effect (event_id, order_id) VALUES ($1, $2)`},
		{"mariadb", maria.Driver, insert},
		{"sqlite", lite.Driver, insert},
	}
	for _, tg := range targets {
		if _, err := tg.drv.DB().Exec(`CREATE TABLE effect (event_id VARCHAR(36) NOT NULL PRIMARY KEY, order_id VARCHAR(64) NOT NULL)`); err != nil {
			b.Fatal(err)
		}
	}
	payload := map[string]any{"order_id": "", "lines": []map[string]any{{"sku": "SKU-000123", "qty": 2, "price": "19.90"}, {"sku": "SKU-000456", "qty": 1, "price": "5.00"}}, "customer": "c-0001", "currency": "EUR", "note": "leave at the door, second floor"}
	makeEvents := func() []idem.Event {
		evs := make([]idem.Event, events)
		for i := range evs {
			id := fmt.Sprint(i % 100)
			payload["order_id"] = id
			evs[i], _ = idem.NewEvent("order.order.placed.v1", "order", id, payload)
		}
		return evs
	}
	results := map[string][]float64{}
	run := 0
	for b.Loop() {
		run++
		for _, tg := range targets {
			evs := makeEvents()
			c, err := inbox.New(tg.drv, inbox.Config{Name: fmt.Sprint("bench-", run)})
			if err != nil {
				b.Fatal(err)
			}
			c.Handle("order.order.placed.v1", func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
				_, err := tx.ExecContext(ctx, tg.insert, ev.ID.String(), ev.AggregateID)
				return err
			})
			ctx := context.Background()
			start := time.Now()
			for i := 0; i < len(evs); i += 100 {
				for _, r := range c.ProcessBatch(ctx, evs[i:i+100]) {
					if r.Outcome != inbox.Applied {
						b.Fatalf("%s: %v %v", tg.name, r.Outcome, r.Err)
					}
				}
			}
			results[tg.name+"-consume"] = append(results[tg.name+"-consume"], float64(events)/time.Since(start).Seconds())

			// Relay: commit the outbox rows first (100 per transaction),
			// then time the relay.
			w := outbox.NewWriter(tg.drv)
			for i := 0; i < len(evs); i += 100 {
				tx, err := tg.drv.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := w.Add(ctx, tx, evs[i:i+100]...); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			pub := memory.New()
			r, err := relay.New(tg.drv, pub, relay.Config{
				PollInterval:  50 * time.Millisecond,
				StatsInterval: -1,
				Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err != nil {
				b.Fatal(err)
			}
			start = time.Now()
			if err := r.Start(ctx); err != nil {
				b.Fatal(err)
			}
			rd := tg.drv.Dialect()
			for {
				bl, err := rd.OutboxBacklog(ctx, tg.drv.Pool())
				if err != nil {
					b.Fatal(err)
				}
				if bl.Rows == 0 {
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			elapsed := time.Since(start)
			stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := r.Stop(stopCtx); err != nil {
				b.Fatal(err)
			}
			cancel()
			if pub.Len() < events {
				b.Fatalf("%s: published %d of %d", tg.name, pub.Len(), events)
			}
			results[tg.name+"-relay"] = append(results[tg.name+"-relay"], float64(events)/elapsed.Seconds())
			if _, err := tg.drv.DB().Exec(`DELETE FROM outbox`); err != nil {
				b.Fatal(err)
			}
		}
	}
	names := make([]string, 0, len(results))
	for n := range results {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		v := results[n]
		b.ReportMetric(v[len(v)-1], n+"-ev/s")
	}
}
