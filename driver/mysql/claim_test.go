package mysql_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testdb"
)

// fillOutbox inserts rows waiting rows over aggregates aggregates (row i
// in aggregate <prefix>i mod aggregates) with MariaDB's sequence engine: a
// big table in one statement.
func fillOutbox(t *testing.T, db *testdb.SQLDB, prefix string, rows, aggregates int) {
	t.Helper()
	db.Exec(t, fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_version)
SELECT UUID(), 'order', CONCAT(?, seq %% %d), 'order.order.changed.v1', '{"n": 1}', seq DIV %d + 1
FROM seq_0_to_%d ORDER BY seq`, aggregates, aggregates, rows-1), prefix)
}

// claimReads claims with p in a transaction of one session and returns the
// rows claimed and how many index and table entries the session read
// meanwhile (MariaDB's Handler_read_* counters).
func claimReads(t *testing.T, db *testdb.SQLDB, p driver.ClaimParams) ([]driver.ClaimedRow, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := db.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reads := func() int64 {
		rows, err := conn.QueryContext(ctx, `SHOW SESSION STATUS LIKE 'Handler_read%'`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var total int64
		for rows.Next() {
			var (
				name string
				n    int64
			)
			if err := rows.Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			total += n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return total
	}
	before := reads()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := db.Driver.Dialect().ClaimOutbox(ctx, driver.SQLExecutor{Q: tx}, p)
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return claimed, reads() - before
}

// TestClaimReadsWaitingRows: a claim reads the rows waiting to be
// published and the ones it takes, never the published rows the table
// keeps (for the replay window) nor the rows an aggregate has waiting
// beyond those it takes.
func TestClaimReadsWaitingRows(t *testing.T) {
	t.Parallel()
	t.Run("PublishedRowsKept", func(t *testing.T) {
		t.Parallel()
		db := testdb.NewMariaDB(t)
		// 20,000 rows published as a relay publishes them (an UPDATE: the
		// index entries they leave wait for InnoDB's purge), then 10
		// waiting ones of the same aggregates: the claim must not read its
		// way through the first.
		fillOutbox(t, db, "a", 20_000, 2_000)
		db.Exec(t, `UPDATE outbox SET published_at = UTC_TIMESTAMP(6)`)
		fillOutbox(t, db, "a", 10, 10)
		db.Exec(t, `ANALYZE TABLE outbox`)
		claimed, reads := claimReads(t, db, driver.ClaimParams{Owner: uuid.New(), Lease: time.Minute, Limit: 1000, MaxPerAggregate: 100, MaxHeads: 500})
		if len(claimed) != 10 {
			t.Fatalf("claimed %d rows, want the 10 waiting", len(claimed))
		}
		if reads > 2_000 {
			t.Errorf("the claim read %d entries for 10 waiting rows among 20,010: it reads the published rows", reads)
		}
		t.Logf("a claim of 10 rows among 20,000 published ones read %d entries", reads)
	})
	t.Run("DeepAggregates", func(t *testing.T) {
		t.Parallel()
		db := testdb.NewMariaDB(t)
		// 10 aggregates with 2,000 waiting rows each; the claim takes
		// their heads and 9 rows after each.
		fillOutbox(t, db, "d", 20_000, 10)
		db.Exec(t, `ANALYZE TABLE outbox`)
		claimed, reads := claimReads(t, db, driver.ClaimParams{Owner: uuid.New(), Lease: time.Minute, Limit: 100, MaxPerAggregate: 10, MaxHeads: 10})
		if len(claimed) != 100 {
			t.Fatalf("claimed %d rows, want 100", len(claimed))
		}
		perAggregate := map[string]int{}
		for _, r := range claimed {
			perAggregate[r.AggregateID]++
			if !strings.HasPrefix(r.AggregateID, "d") || r.AggregateVersion > 10 {
				t.Fatalf("claimed %s version %d, want the first 10 rows of each aggregate", r.AggregateID, r.AggregateVersion)
			}
		}
		if len(perAggregate) != 10 {
			t.Errorf("rows of %d aggregates claimed, want 10", len(perAggregate))
		}
		if reads > 2_000 {
			t.Errorf("the claim read %d entries to take 100 rows of 10 aggregates 2,000 deep: it reads whole aggregates", reads)
		}
		t.Logf("a claim of 100 rows of 10 aggregates 2,000 deep read %d entries", reads)
	})
}
