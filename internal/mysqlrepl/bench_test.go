package mysqlrepl_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/internal/testdb"
)

// benchRows is the number of one-row transactions BenchmarkRead reads.
const benchRows = 5000

// BenchmarkRead measures the reader on MariaDB: each iteration dials,
// dumps from a position before benchRows transactions of one outbox row
// (Debezium's columns, a 150-byte JSON payload in a LONGTEXT), reads them
// and decodes their rows; rows/s. The shared server's binlog may hold
// other tests' events among them, which are read too. The same shape
// against the MySQL 8 stand-in: internal/mysql8test's BenchmarkRead.
func BenchmarkRead(b *testing.B) {
	db := testdb.NewMariaDB(b, testdb.Options{NoMigrate: true})
	exec(b, db.DB, `CREATE TABLE outbox (id VARCHAR(36) CHARACTER SET ascii NOT NULL PRIMARY KEY,
    aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL,
    payload JSON NOT NULL) CHARACTER SET utf8mb4`)
	pos := binlogPos(b, db.DB)
	payload := `{"sku": "A-1", "qty": 2, "price": 9.5, "lines": [{"n": 1, "note": "` + strings.Repeat("x", 80) + `"}]}`
	for i := range benchRows {
		exec(b, db.DB, `INSERT INTO outbox VALUES (?, 'Order', ?, 'OrderPlaced', ?)`,
			fmt.Sprintf("0b7a3e6c-1111-4c2e-9a8e-%012d", i), fmt.Sprint(i), payload)
	}
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		c := dial(b, config(b))
		if err := c.StartDump(ctx(b), pos); err != nil {
			b.Fatal(err)
		}
		n := 0
		for n < benchRows {
			ev, err := c.ReadEvent()
			if err != nil {
				b.Fatal(err)
			}
			if e, ok := ev.(*mysqlrepl.RowsEvent); ok && e.Table.Schema == db.Name {
				rows, err := e.Rows()
				if err != nil {
					b.Fatal(err)
				}
				n += len(rows)
			}
		}
		_ = c.Close()
	}
	b.ReportMetric(float64(benchRows*b.N)/time.Since(start).Seconds(), "rows/s")
}
