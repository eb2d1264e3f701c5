package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
)

// BenchmarkClaim measures the relay's claim on SQLite through Open (each
// connection keeps its statements prepared) and through a plain sql.Open
// of the same DSN (every statement parsed again): on an empty outbox, what
// an idle relay does at each poll, and with 10 rows in 10 aggregates to
// claim, mark and write again each time.
//
//	go test -run '^$' -bench BenchmarkClaim -benchtime 2s ./driver/sqlite/
func BenchmarkClaim(b *testing.B) {
	for _, prepared := range []bool{true, false} {
		for _, rows := range []int{0, 10} {
			name := fmt.Sprintf("prepared=%v/rows=%d", prepared, rows)
			b.Run(name, func(b *testing.B) { benchClaim(b, prepared, rows) })
		}
	}
}

func benchClaim(b *testing.B, prepared bool, n int) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "bench.db")
	var db *sql.DB
	var err error
	if prepared {
		db, err = sqlite.Open(path)
	} else {
		var dsn string
		if dsn, err = sqlite.DSN(path); err == nil {
			db, err = sql.Open("sqlite", dsn)
			db.SetMaxOpenConns(1)
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		b.Fatal(err)
	}
	dialect := drv.Dialect()
	w := outbox.NewWriter(drv)
	write := func() {
		tx, err := drv.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for i := range n {
			ev, err := idem.NewEvent("bench.item.made.v1", "item", fmt.Sprint(i), map[string]int{"i": i})
			if err != nil {
				b.Fatal(err)
			}
			if err := w.Add(ctx, tx, ev); err != nil {
				b.Fatal(err)
			}
		}
		if err := drv.Commit(ctx, tx); err != nil {
			b.Fatal(err)
		}
	}
	p := driver.ClaimParams{Lease: 30 * time.Second, Limit: 1000, MaxPerAggregate: 100, MaxHeads: 500}
	b.ResetTimer()
	for b.Loop() {
		if n > 0 {
			b.StopTimer()
			write()
			b.StartTimer()
		}
		p.Owner = uuid.New()
		tx, err := drv.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		rows, err := dialect.ClaimOutbox(ctx, drv.Tx(tx), p)
		if err != nil || len(rows) != n {
			b.Fatalf("claimed %d rows, %v; want %d", len(rows), err, n)
		}
		if err := drv.Commit(ctx, tx); err != nil {
			b.Fatal(err)
		}
		if n > 0 {
			seqs := make([]int64, len(rows))
			for i, r := range rows {
				seqs[i] = r.Seq
			}
			if _, err := dialect.MarkPublished(ctx, drv.Pool(), p.Owner, seqs); err != nil {
				b.Fatal(err)
			}
		}
	}
}
