package cdc

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/internal/testdb"
)

// TestDeleteWaitsForVisibleTransactions: the log sends a transaction once
// its commit is flushed, a moment before other sessions see its rows. A
// DELETE of published rows that runs in that moment deletes nothing; the
// relay must see that their transaction had not ended for its snapshot and
// delete them once it has, or the rows would stay in the outbox, published,
// with the slot's position past them. The open transaction here stands for
// that moment, made as long as the test needs.
func TestDeleteWaitsForVisibleTransactions(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t, testdb.Options{MaxConns: 8})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := &Relay{pool: pg.Pool, sql: newQueries(pg.Schema, "outbox", "unused")}
	r.cfg.QueryTimeout = 10 * time.Second

	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	id := uuid.New()
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', '1', 'order.placed.v1', '{}')`, id); err != nil {
		t.Fatal(err)
	}
	var xid8 int64
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid8); err != nil {
		t.Fatal(err)
	}
	xid := uint32(xid8) // what pgoutput's Begin message carries

	var visible bool
	if err := pg.Pool.QueryRow(ctx, visibleSQL, []int64{int64(xid)}).Scan(&visible); err != nil {
		t.Fatal(err)
	}
	if visible {
		t.Fatal("visibleSQL says an open transaction has ended")
	}

	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := r.deleteVisible(ctx, []string{id.String()}, []uint32{xid})
		done <- result{n, err}
	}()
	select {
	case res := <-done:
		t.Fatalf("deleteVisible returned (%d, %v) while the rows' transaction was open", res.n, res.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.n != 1 {
		t.Errorf("deleteVisible deleted %d rows, want the 1 committed while it waited", res.n)
	}
	if n := pg.Count(t, "outbox"); n != 0 {
		t.Errorf("%d rows left in the outbox", n)
	}

	// Ended transactions, committed or rolled back, and none at all.
	rb, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var rolledBack int64
	if err := rb.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&rolledBack); err != nil {
		t.Fatal(err)
	}
	if err := rb.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, xids := range [][]uint32{{xid}, {xid, uint32(rolledBack)}, nil} {
		if err := r.waitVisible(ctx, xids); err != nil {
			t.Errorf("waitVisible(%v): %v", xids, err)
		}
	}
}
