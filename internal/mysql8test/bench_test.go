package mysql8test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"vitess.io/vitess/go/mysql"
	"vitess.io/vitess/go/mysql/replication"

	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/internal/mysqlrepl/binlogtest"
)

// benchRows is the number of one-row transactions BenchmarkRead reads,
// as internal/mysqlrepl's BenchmarkRead does on MariaDB.
const benchRows = 5000

// BenchmarkRead measures the reader against the stand-in, over TCP: each
// iteration dials, dumps, reads benchRows transactions of one outbox row
// (GTID, BEGIN, table map, rows v2, XID; Debezium's columns and a
// 150-byte document in a JSON column, decoded to text) that vitess's
// listener writes from bytes built once; rows/s. What it measures is the
// reader and the stand-in, not a server: no disk, no other session.
func BenchmarkRead(b *testing.B) {
	s := Start(b, Plugins{Greeting: mysql.CachingSha2Password, SHA2: true}, nil)
	sid, _ := replication.ParseSID(uuidA)
	prev, _ := replication.ParseMysql56GTIDSet(uuidA + ":1")
	bl := NewBinlog()
	events := bl.Start("binlog.000003", prev)
	doc := binlogtest.JSON(binlogtest.Object{{"qty", 2}, {"sku", "A-1"}, {"lines", []any{binlogtest.Object{{"n", 1}, {"note", strings.Repeat("x", 80)}}}}, {"price", 9.5}}, false)
	for i := range benchRows {
		row := debeziumRow(fmt.Sprintf("0b7a3e6c-1111-4c2e-9a8e-%012d", i), "Order", fmt.Sprint(i), "OrderPlaced", doc)
		events = append(events, bl.GTID(sid, uint64(i+2)), bl.Query("shop", "BEGIN"), bl.TableMap(9, debeziumTable(), nil),
			bl.WriteRows(9, mysql.Rows{DataColumns: allColumns(5), Rows: []mysql.Row{row}}), bl.XID())
	}
	s.Stream = func(c *mysql.Conn, _ DumpRequest) error { return Write(c, events...) }
	cfg := mysqlrepl.Config{Addr: s.Addr, User: s.User, Password: s.Password, AllowPublicKeyRetrieval: true}
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		cfg.ServerID = 1_000_000 + rand.Uint32N(1<<30)
		c, err := mysqlrepl.Dial(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.StartDump(context.Background(), uuidA+":1"); err != nil {
			b.Fatal(err)
		}
		<-s.Dumps
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		n := 0
		for n < benchRows {
			ev, err := c.ReadEvent()
			if err != nil {
				b.Fatal(err)
			}
			if e, ok := ev.(*mysqlrepl.RowsEvent); ok {
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
