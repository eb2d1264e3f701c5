package cdc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/outbox"
)

// BenchmarkDrain measures the drain of a backlog written before the relay
// starts (the slot exists), to the in-process publisher: rows, then WAL
// messages. b.N events in 1,000 aggregates, 100 per transaction.
//
//	IDEM_TEST_SERVERS=postgres make test ARGS='-run XXX -bench Drain -benchtime 20000x ./relay/cdc/'
func BenchmarkDrain(b *testing.B) {
	for _, mode := range []string{"table", "wal"} {
		b.Run(mode, func(b *testing.B) {
			pg := newDB(b)
			cfg := fastConfig(nil)
			// The slot first: it reads from its creation on.
			first := start(b, pg, memory.New(), cfg)
			stop(b, first)
			w := outbox.NewWriter(pg.Driver)
			if mode == "wal" {
				var err error
				if w, err = outbox.NewLogWriter(pg.Driver, pg.Schema); err != nil {
					b.Fatal(err)
				}
			}
			ctx := context.Background()
			for i := 0; i < b.N; i += 100 {
				err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
					var evs []idem.Event
					for j := i; j < min(i+100, b.N); j++ {
						evs = append(evs, event(b, fmt.Sprint(j%1000), j/1000+1))
					}
					return w.Add(ctx, tx, evs...)
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			pub := memory.New()
			b.ResetTimer()
			began := time.Now()
			start(b, pg, pub, cfg)
			ctx2, cancel := context.WithTimeout(ctx, 10*time.Minute)
			defer cancel()
			if err := pub.WaitLen(ctx2, b.N); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "events/s")
		})
	}
}
