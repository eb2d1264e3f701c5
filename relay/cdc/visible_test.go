package cdc

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testdb"
)

// TestFirstInvisible checks the query behind the visibility gate: an open
// transaction is not visible, ended ones (committed or rolled back) are,
// and the position returned is that of the first one not visible.
func TestFirstInvisible(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t, testdb.Options{MaxConns: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := &source{pool: pg.Pool}
	begin := func() (uint32, func(commit bool)) {
		t.Helper()
		tx, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var xid8 int64
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid8); err != nil {
			t.Fatal(err)
		}
		return uint32(xid8), func(commit bool) { // the log's 32-bit id
			var err error
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	committed, end := begin()
	end(true)
	rolledBack, end := begin()
	end(false)
	open, end := begin()
	defer end(false)

	for _, tc := range []struct {
		xids []uint32
		want int
	}{
		{nil, 0},
		{[]uint32{committed}, 0},
		{[]uint32{committed, rolledBack}, 0},
		{[]uint32{open}, 1},
		{[]uint32{committed, open}, 2},
		{[]uint32{committed, open, rolledBack}, 2},
	} {
		got, err := r.firstInvisible(ctx, tc.xids)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("firstInvisible(%v) = %d, want %d", tc.xids, got, tc.want)
		}
	}
	if err := r.waitVisible(ctx, []uint32{committed, rolledBack}); err != nil {
		t.Errorf("waitVisible of ended transactions: %v", err)
	}
}
