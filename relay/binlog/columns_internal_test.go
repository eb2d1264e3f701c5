package binlog

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/internal/testdb"
)

// wideColumns are the columns of the table of TestColumnsFitTableMaps: a
// column of each type MariaDB writes into a table map.
var wideColumns = [][2]string{
	{"c_tiny", "TINYINT NOT NULL"}, {"c_utiny", "TINYINT UNSIGNED"}, {"c_small", "SMALLINT"},
	{"c_medium", "MEDIUMINT"}, {"c_int", "INT UNSIGNED"}, {"c_big", "BIGINT NOT NULL"},
	{"c_float", "FLOAT"}, {"c_double", "DOUBLE"}, {"c_dec", "DECIMAL(12,3)"}, {"c_dec2", "DECIMAL(40,10)"},
	{"c_year", "YEAR"}, {"c_date", "DATE"}, {"c_time", "TIME(3)"}, {"c_dt", "DATETIME(6) NOT NULL"},
	{"c_dt0", "DATETIME"}, {"c_ts", "TIMESTAMP(2) NULL"},
	{"c_char", "CHAR(36) CHARACTER SET ascii"}, {"c_char8", "CHAR(10) CHARACTER SET utf8mb4"},
	{"c_bigchar", "CHAR(255) CHARACTER SET utf8mb4"}, {"c_bin", "BINARY(16)"},
	{"c_vc", "VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL"}, {"c_vb", "VARBINARY(300)"},
	{"c_tt", "TINYTEXT"}, {"c_text", "TEXT"}, {"c_mt", "MEDIUMTEXT"}, {"c_lt", "LONGTEXT"},
	{"c_tb", "TINYBLOB"}, {"c_blob", "BLOB"}, {"c_mb", "MEDIUMBLOB"}, {"c_lb", "LONGBLOB"}, {"c_json", "JSON"},
	{"c_enum", "ENUM('a','b')"}, {"c_set", "SET('x','y')"}, {"c_bit", "BIT(5)"}, {"c_geo", "POINT"},
	{"c_uuid", "UUID"}, {"c_inet6", "INET6"},
}

// TestColumnsFitTableMaps: information_schema's columns fit the table map
// the server writes for them, whatever their type, and a change of a
// column's type, length, precision or nullability is seen. The shared
// server writes the names (binlog_row_metadata = FULL): they show that
// the columns are compared in the right order.
func TestColumnsFitTableMaps(t *testing.T) {
	db := testdb.NewMariaDB(t, testdb.Options{NoMigrate: true})
	var defs []string
	for _, c := range wideColumns {
		defs = append(defs, c[0]+" "+c[1])
	}
	db.Exec(t, "CREATE TABLE wide ("+strings.Join(defs, ", ")+")")
	r, err := New(db.URL, memory.New(), Config{Tables: idem.Tables{Outbox: "wide"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.src.db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var pos string
	if err := db.DB.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	conn, err := mysqlrepl.Dial(ctx, r.src.repl)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := conn.StartDump(ctx, pos); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, "INSERT INTO wide (c_tiny, c_big, c_dt, c_vc) VALUES (1, 2, UTC_TIMESTAMP(6), 'x')")
	var tm *mysqlrepl.TableMapEvent
	for tm == nil {
		ev, err := conn.ReadEvent()
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := ev.(*mysqlrepl.TableMapEvent); ok && e.Schema == db.Name && e.Table == "wide" {
			tm = e
		}
	}

	cols, err := r.src.readColumns(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := columnsDiffer(cols, tm.Columns); diff != "" {
		t.Fatalf("the table's own table map: %s", diff)
	}
	for i, c := range cols {
		if tm.Columns[i].Name != c.name || c.name != wideColumns[i][0] {
			t.Errorf("column %d: %s in information_schema, %s in the binlog", i+1, c.name, tm.Columns[i].Name)
		}
		// MariaDB marks YEAR unsigned in the binlog; its value is decoded
		// the same either way.
		if c.unsigned != strings.Contains(wideColumns[i][1], "UNSIGNED") || c.unsigned != tm.Columns[i].Unsigned && c.dataType != "year" {
			t.Errorf("column %s: unsigned %v in information_schema, %v in the binlog", c.name, c.unsigned, tm.Columns[i].Unsigned)
		}
	}
	if diff := columnsDiffer(cols, tm.Columns[:len(tm.Columns)-1]); !strings.Contains(diff, "the rows in the binlog have 36 columns, the table 37") {
		t.Errorf("a column fewer: %q", diff)
	}

	// Each change, made on the table, then undone.
	for _, change := range [][2]string{
		{"c_vc", "VARCHAR(200) CHARACTER SET utf8mb4 NOT NULL"},
		{"c_vc", "VARCHAR(255) CHARACTER SET utf8mb4 NULL"},
		{"c_vc", "TEXT NOT NULL"},
		{"c_dec", "DECIMAL(12,2)"},
		{"c_dt", "DATETIME(3) NOT NULL"},
		{"c_ts", "DATETIME(2) NULL"},
		{"c_lt", "MEDIUMTEXT"},
		{"c_char", "CHAR(37) CHARACTER SET ascii"},
		{"c_char8", "CHAR(10) CHARACTER SET ascii"},
		{"c_int", "BIGINT UNSIGNED"},
		{"c_tiny", "SMALLINT NOT NULL"},
		{"c_enum", "VARCHAR(1)"},
	} {
		old := ""
		for _, c := range wideColumns {
			if c[0] == change[0] {
				old = c[1]
			}
		}
		db.Exec(t, "ALTER TABLE wide MODIFY "+change[0]+" "+change[1])
		changed, err := r.src.readColumns(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if diff := columnsDiffer(changed, tm.Columns); !strings.Contains(diff, "is not the table's "+change[0]+" ") {
			t.Errorf("%s %s: %q", change[0], change[1], diff)
		}
		db.Exec(t, "ALTER TABLE wide MODIFY "+change[0]+" "+old)
	}
}
