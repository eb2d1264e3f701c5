package inbox_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxmetrics"
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
// With IDEM_BENCH_METRICS=1 two more variants join the rounds, the same
// consumers with Prometheus metrics on (inbox/inboxmetrics, registered and
// gathered once per round, as a scrape would): dedup_metrics and
// batch100_metrics, and the ratios metrics/plain (target >= 0.95), over
// the whole run and as the median of the rounds' ratios. Every other round
// runs the metered variants before the plain ones.
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
	variants := 3
	var metered *meteredConsumers
	if os.Getenv("IDEM_BENCH_METRICS") == "1" {
		variants = 5
		metered = newMeteredConsumers(b, pg, insert)
	}

	const rounds, perRound = 8, 500
	var elapsed [5]time.Duration
	var perRoundRatio [2][]float64 // metrics/plain rate, per round: dedup, batch100
	var last [5]time.Duration      // of the current round, by variant
	order := []int{0, 1, 2, 3, 4}[:variants]
	for b.Loop() {
		for round := range rounds {
			evs := make([]idem.Event, perRound)
			if metered != nil {
				// Every other round, the metered variants go first: no
				// variant gains from its place in the round.
				order = []int{0, 1, 2, 3, 4}
				if round%2 == 1 {
					order = []int{0, 3, 4, 1, 2}
				}
			}
			for _, v := range order {
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
				case 3, 4:
					metered.run(b, ctx, v == 4, evs)
				}
				last[v] = time.Since(start)
				elapsed[v] += last[v]
			}
			if metered != nil {
				perRoundRatio[0] = append(perRoundRatio[0], float64(last[1])/float64(last[3]))
				perRoundRatio[1] = append(perRoundRatio[1], float64(last[2])/float64(last[4]))
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
	if metered != nil {
		b.ReportMetric(rate(3), "dedup_metrics_events/s")
		b.ReportMetric(rate(4), "batch100_metrics_events/s")
		b.ReportMetric(rate(3)/rate(1), "dedup_metrics/dedup")
		b.ReportMetric(rate(4)/rate(2), "batch100_metrics/batch100")
		// The same ratios round by round (each pair ran one after the
		// other), median: what a burst of load on the machine moves least.
		b.ReportMetric(median(perRoundRatio[0]), "dedup_metrics/dedup_round_median")
		b.ReportMetric(median(perRoundRatio[1]), "batch100_metrics/batch100_round_median")
	}
	b.ReportMetric(0, "ns/op")
}

// meteredConsumers are the benchmark's consumers with metrics on.
type meteredConsumers struct {
	dedup, batch *inbox.Consumer[pgx.Tx]
	reg          *prometheus.Registry
}

func newMeteredConsumers(b *testing.B, pg *testdb.PG, h inbox.HandlerFunc[pgx.Tx]) *meteredConsumers {
	m := &meteredConsumers{reg: prometheus.NewRegistry()}
	for _, c := range []struct {
		name string
		dst  **inbox.Consumer[pgx.Tx]
	}{{"bench-dedup-metrics", &m.dedup}, {"bench-batch-metrics", &m.batch}} {
		metrics := inboxmetrics.New(c.name, inboxmetrics.Options{})
		consumer, err := inbox.New(pg.Driver, inbox.Config{Name: c.name, Observer: metrics.Observer()})
		if err != nil {
			b.Fatal(err)
		}
		consumer.Handle("order.order.placed.v1", h)
		metrics.Watch(consumer)
		m.reg.MustRegister(metrics)
		*c.dst = consumer
	}
	return m
}

// run applies evs one at a time, or in batches of 100, then gathers the
// metrics once, as a scrape would.
func (m *meteredConsumers) run(b *testing.B, ctx context.Context, batched bool, evs []idem.Event) {
	if !batched {
		for _, ev := range evs {
			if o, err := m.dedup.Process(ctx, ev); o != inbox.Applied {
				b.Fatal(o, err)
			}
		}
	} else {
		for i := 0; i < len(evs); i += 100 {
			for _, r := range m.batch.ProcessBatch(ctx, evs[i:i+100]) {
				if r.Outcome != inbox.Applied {
					b.Fatal(r.Outcome, r.Err)
				}
			}
		}
	}
	if _, err := m.reg.Gather(); err != nil {
		b.Fatal(err)
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
