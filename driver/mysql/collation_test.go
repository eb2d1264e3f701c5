package mysql_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testdb"
)

// TestCollations: ids, names and keys compare as the docs say, and as they
// would on MySQL 8, whose default collation (utf8mb4_0900_ai_ci) is NO PAD
// and case-insensitive where MariaDB's is PAD SPACE. Every text column of
// idem's tables is utf8mb4_bin (ascii_general_ci for the CHAR(36) UUID
// columns), PAD SPACE on both servers: "a" and "a " are one consumer, one
// aggregate; "A" and "a" are two. The connection compares a literal with a
// parameter in utf8mb4_bin too (ParseURL's collation). Texts of the
// failure store read back byte for byte and filter exactly, trailing
// spaces and all (driver/internal/textenc).
func TestCollations(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var conn string
	var padded, folded int
	if err := db.DB.QueryRowContext(ctx, `SELECT @@collation_connection, 'a' = 'a ', 'A' = 'a'`).Scan(&conn, &padded, &folded); err != nil {
		t.Fatal(err)
	}
	if conn != "utf8mb4_bin" || padded != 1 || folded != 0 {
		t.Errorf("connection: collation %s, 'a' = 'a ' is %d, 'A' = 'a' is %d; want utf8mb4_bin, 1, 0", conn, padded, folded)
	}

	rows, err := db.DB.QueryContext(ctx, `SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, COLLATION_NAME FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = ? AND COLLATION_NAME IS NOT NULL ORDER BY TABLE_NAME, ORDINAL_POSITION`, db.Name)
	if err != nil {
		t.Fatal(err)
	}
	columns := 0
	for rows.Next() {
		var table, column, typ, collation string
		if err := rows.Scan(&table, &column, &typ, &collation); err != nil {
			t.Fatal(err)
		}
		columns++
		switch {
		case collation == "utf8mb4_bin":
		case collation == "ascii_general_ci" && typ == "char(36)":
		default:
			t.Errorf("%s.%s %s: collation %s, want utf8mb4_bin", table, column, typ, collation)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if columns < 40 {
		t.Fatalf("%d text columns: the tables were not read", columns)
	}

	d, ex := db.Driver.Dialect(), db.Driver.Pool()
	id := idem.NewEventID()
	for _, c := range []struct {
		consumer string
		want     bool
	}{{"stock", true}, {"stock ", false}, {"Stock", true}} {
		got, err := d.MarkProcessed(ctx, ex, c.consumer, []driver.Mark{{ID: id}})
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != c.want {
			t.Errorf("marker of consumer %q after those before: inserted %v, want %v", c.consumer, got[0], c.want)
		}
	}

	for _, name := range []string{"order.placed", "order.placed "} {
		if _, err := d.SaveFailed(ctx, ex, idem.FailedMessage{Consumer: "billing", EventID: idem.NewEventID(),
			EventName: name, Body: []byte(name), Error: "boom", Attempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"order.placed", "order.placed "} {
		list, err := d.ListFailed(ctx, ex, idem.FailedFilter{Consumer: "billing", EventName: name, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].EventName != name || string(list[0].Body) != name {
			t.Errorf("failed messages named %q: %d, want the one of that name", name, len(list))
		}
	}
}
