package postgres_test

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
)

// TestStatusReadsIndexesOnly: on a processed_event of 300,000 markers
// (IDEM_TEST_STATUS_MARKERS for another size) of three consumers, spread
// over the last days, the status statements read a few hundred pages at
// most (the table and its primary key are thousands): the names come from
// skipping through the primary key, each consumer's figures from its range
// of the (consumer_name, processed_at) index.
func TestStatusReadsIndexesOnly(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	markers := 300000
	if v := os.Getenv("IDEM_TEST_STATUS_MARKERS"); v != "" { // a bigger table for a measurement
		var err error
		if markers, err = strconv.Atoi(v); err != nil {
			t.Fatalf("IDEM_TEST_STATUS_MARKERS=%q: %v", v, err)
		}
	}
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at)
SELECT (ARRAY['billing', 'shipping', 'stock'])[1 + s % 3], gen_random_uuid(), now() - s * interval '1 second'
FROM generate_series(1, $1::integer) AS s`, markers)
	pg.Exec(t, `INSERT INTO failed_message (consumer_name, source, body, error) VALUES ('billing', 'billing.events', 'x', 'boom')`)
	pg.Exec(t, `ANALYZE processed_event`)
	pg.Exec(t, `ANALYZE failed_message`)
	var tablePages int64
	if err := pg.Pool.QueryRow(ctx, `SELECT relpages FROM pg_class WHERE oid = 'processed_event'::regclass`).Scan(&tablePages); err != nil {
		t.Fatal(err)
	}

	s := postgres.StatusStatements(idem.Tables{})
	since := time.Now().Add(-time.Minute)
	for _, tc := range []struct {
		name string
		sql  string
		args []any
	}{
		{"names", s.Names, nil},
		{"consumer", s.Consumer, s.ConsumerArgs("stock", "stock", since)},
		{"outbox", s.Outbox, nil},
	} {
		var plan []byte
		if err := pg.Pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+tc.sql, tc.args...).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var doc []struct {
			Plan struct {
				SharedHit  int64 `json:"Shared Hit Blocks"`
				SharedRead int64 `json:"Shared Read Blocks"`
			} `json:"Plan"`
			ExecutionTime float64 `json:"Execution Time"`
		}
		if err := json.Unmarshal(plan, &doc); err != nil || len(doc) != 1 {
			t.Fatalf("%s: plan %s: %v", tc.name, plan, err)
		}
		pages := doc[0].Plan.SharedHit + doc[0].Plan.SharedRead
		t.Logf("%s: %d pages (processed_event has %d), %.2f ms", tc.name, pages, tablePages, doc[0].ExecutionTime)
		if testing.Verbose() {
			var lines []string
			rows, err := pg.Pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+tc.sql, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				lines = append(lines, line)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s:\n%s", tc.name, strings.Join(lines, "\n"))
		}
		if pages > 300 {
			t.Errorf("%s reads %d pages (processed_event has %d): it scans the table or a whole index\n%s", tc.name, pages, tablePages, plan)
		}
	}

	st, err := postgres.MustDialect(idem.Tables{}).ReadStatus(ctx, pg.Driver.Pool(), driver.StatusParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Consumers) != 3 || st.Consumers[0].Name != "billing" || st.Consumers[0].Parked != 1 {
		t.Fatalf("consumers: %+v, want billing (1 parked), shipping and stock", st.Consumers)
	}
	for _, c := range st.Consumers {
		var want int64
		if err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event WHERE consumer_name = $1 AND processed_at > $2`,
			c.Name, st.Now.Add(-time.Minute)).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if c.Processed != want || want == 0 {
			t.Errorf("%s: %d processed in the last minute, want %d (counted over the table)", c.Name, c.Processed, want)
		}
	}
}
