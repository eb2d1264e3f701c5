package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// BenchmarkConsumeInterleaved measures events/s for a handler that inserts
// one row, on the test PostgreSQL (fsync on), one worker, three ways:
//
//	no_dedup:  one transaction per event, no processed_event marker (baseline)
//	dedup:     Consumer.Process, one transaction per event with its marker
//	batch100:  Consumer.ProcessBatch, 100 events per transaction
//
// The variants run in alternating rounds of 500 events, so that they share
// the machine's noise, and it reports the ratios the targets are about:
// dedup/no_dedup (target >= 0.8) and batch100/dedup (target >= 5).
//
// Run: IDEM_TEST_SHELL=1 IDEM_TEST_CMD='go test -run XXX -bench BenchmarkConsumeInterleaved -benchtime 1x -count 5 ./inbox/' bash scripts/test.sh
func BenchmarkConsumeInterleaved(b *testing.B) {
	pg := testdb.NewPostgres(b)
	pg.Exec(b, `CREATE TABLE effect (event_id uuid PRIMARY KEY, order_id text NOT NULL)`)
	ctx := context.Background()
	insert := func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, order_id) VALUES ($1, $2)`, ev.ID, ev.AggregateID)
		return err
	}
	dedup, _ := inbox.New(pg.Driver, inbox.Config{Name: "bench-dedup"})
	dedup.Handle("order.order.placed.v1", insert)
	batch, _ := inbox.New(pg.Driver, inbox.Config{Name: "bench-batch"})
	batch.Handle("order.order.placed.v1", insert)

	const rounds, perRound = 8, 500
	var elapsed [3]time.Duration
	for b.Loop() {
		for range rounds {
			evs := make([]idem.Event, perRound)
			for v := range 3 {
				for i := range evs {
					evs[i], _ = idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]int{"i": i})
				}
				start := time.Now()
				switch v {
				case 0:
					for _, ev := range evs {
						tx, err := pg.Pool.Begin(ctx)
						if err != nil {
							b.Fatal(err)
						}
						if err := insert(ctx, tx, ev); err != nil {
							b.Fatal(err)
						}
						if err := tx.Commit(ctx); err != nil {
							b.Fatal(err)
						}
					}
				case 1:
					for _, ev := range evs {
						if o, err := dedup.Process(ctx, ev); o != inbox.Applied {
							b.Fatal(o, err)
						}
					}
				case 2:
					for i := 0; i < len(evs); i += 100 {
						for _, r := range batch.ProcessBatch(ctx, evs[i:i+100]) {
							if r.Outcome != inbox.Applied {
								b.Fatal(r.Outcome, r.Err)
							}
						}
					}
				}
				elapsed[v] += time.Since(start)
			}
		}
	}
	n := float64(b.N * rounds * perRound)
	rate := func(v int) float64 { return n / elapsed[v].Seconds() }
	b.ReportMetric(rate(0), "no_dedup_events/s")
	b.ReportMetric(rate(1), "dedup_events/s")
	b.ReportMetric(rate(2), "batch100_events/s")
	b.ReportMetric(rate(1)/rate(0), "dedup/no_dedup")
	b.ReportMetric(rate(2)/rate(1), "batch100/dedup")
	b.ReportMetric(0, "ns/op")
}
