package mysql8test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"vitess.io/vitess/go/mysql"
	"vitess.io/vitess/go/mysql/binlog"
	"vitess.io/vitess/go/mysql/replication"
	"vitess.io/vitess/go/sqltypes"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/mysqlrepl/binlogtest"
	"github.com/idem-go/idem/internal/testsvc"
	binlogrelay "github.com/idem-go/idem/relay/binlog"
)

// outboxDB is the SQL side of a MySQL 8 server with an outbox of
// Debezium's columns (id, aggregatetype, aggregateid, type, payload JSON)
// in the database shop and a binlog_position table: what the binlog relay
// asks at its start (version, settings, user, privileges, columns, tables,
// its lock, its position and GTID_SUBSET checks) and while it runs (the
// locking read of each transaction's rows, their delete, the position it
// stores), answered by the stand-in as MySQL 8.0.36 would.
type outboxDB struct {
	mu       sync.Mutex
	stored   string   // binlog_position.gtid_pos
	deleted  []string // ids of the DELETEs
	purged   string   // @@global.gtid_purged
	executed string   // @@global.gtid_executed
	subset   func(a, b string) bool
}

var (
	reStore  = regexp.MustCompile(`^INSERT INTO .shop.\..binlog_position. \(outbox_table, gtid_pos, binlog_file, binlog_pos, updated_at\)\s+VALUES \('outbox', '([^']*)'`)
	reDelete = regexp.MustCompile(`^DELETE FROM .shop.\..outbox. WHERE id IN \((.*)\)$`)
	reCount  = regexp.MustCompile(`^SELECT COUNT\(\*\) FROM .shop.\..outbox. WHERE id IN \((.*)\) LOCK IN SHARE MODE$`)
)

func (d *outboxDB) answer(q string) (*sqltypes.Result, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	one := func(name, typ, v string) *sqltypes.Result {
		return sqltypes.MakeTestResult(sqltypes.MakeTestFields(name, typ), v)
	}
	switch {
	case q == "SELECT @@version":
		return one("@@version", "varchar", "8.0.36"), true
	case strings.HasPrefix(q, "SELECT @@log_bin, @@binlog_format"):
		return sqltypes.MakeTestResult(sqltypes.MakeTestFields("a|b|c|d|e|f|g|h|i", "int64|varchar|varchar|varchar|int64|varchar|varchar|varchar|int64"),
			"1|ROW|FULL|MINIMAL|1|ON|ON||2592000"), true
	case q == "SELECT CURRENT_USER()":
		return one("CURRENT_USER()", "varchar", "relay@%"), true
	case strings.HasPrefix(q, "SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = '\\'relay\\'@\\'%\\''"):
		return sqltypes.MakeTestResult(sqltypes.MakeTestFields("PRIVILEGE_TYPE", "varchar"), "SELECT", "REPLICATION SLAVE", "REPLICATION CLIENT"), true
	case strings.HasPrefix(q, "SELECT COLUMN_NAME, LOWER(DATA_TYPE)") && strings.Contains(q, "TABLE_SCHEMA = 'shop' AND TABLE_NAME = 'outbox'"):
		return sqltypes.MakeTestResult(sqltypes.MakeTestFields("a|b|c|d|e|f|g|h", "varchar|varchar|int64|int64|int64|int64|int64|int64"),
			"id|varchar|0|0|36|null|null|null", "aggregatetype|varchar|0|0|1020|null|null|null",
			"aggregateid|varchar|0|0|1020|null|null|null", "type|varchar|0|0|1020|null|null|null",
			"payload|json|0|0|null|null|null|null"), true
	case strings.HasPrefix(q, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'shop' AND TABLE_NAME = 'binlog_position'"):
		return one("COUNT(*)", "int64", "1"), true
	case strings.HasPrefix(q, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'shop' AND TABLE_NAME = 'consumer_pause'"):
		// The table of operators' pauses is not there: a database with
		// Debezium's outbox and the relay's position only.
		return one("COUNT(*)", "int64", "0"), true
	case strings.HasPrefix(q, "SELECT GET_LOCK("), strings.HasPrefix(q, "SELECT IS_USED_LOCK("):
		return one("x", "int64", "1"), true
	case strings.HasPrefix(q, "DO RELEASE_LOCK("):
		return &sqltypes.Result{}, true
	case strings.HasPrefix(q, "SELECT gtid_pos FROM `shop`.`binlog_position` WHERE outbox_table = 'outbox'"):
		if d.stored == "" {
			return &sqltypes.Result{Fields: sqltypes.MakeTestFields("gtid_pos", "varchar")}, true
		}
		return one("gtid_pos", "varchar", d.stored), true
	case strings.HasPrefix(q, "SELECT @@global.gtid_purged, @@global.gtid_executed"):
		pos := regexp.MustCompile(`GTID_SUBSET\(@@global.gtid_purged, '([^']*)'\)`).FindStringSubmatch(q)[1]
		b := func(v bool) string {
			if v {
				return "1"
			}
			return "0"
		}
		return sqltypes.MakeTestResult(sqltypes.MakeTestFields("a|b|c|d", "varchar|varchar|int64|int64"),
			d.purged+"|"+d.executed+"|"+b(d.subset(d.purged, pos))+"|"+b(d.subset(pos, d.executed))), true
	case q == "SHOW BINARY LOGS":
		return sqltypes.MakeTestResult(sqltypes.MakeTestFields("Log_name|File_size|Encrypted", "varchar|int64|varchar"), "binlog.000003|4096|No"), true
	}
	if m := reStore.FindStringSubmatch(q); m != nil {
		d.stored = m[1]
		return &sqltypes.Result{RowsAffected: 1}, true
	}
	if m := reDelete.FindStringSubmatch(q); m != nil {
		ids := strings.Split(m[1], ",")
		d.deleted = append(d.deleted, ids...)
		return &sqltypes.Result{RowsAffected: uint64(len(ids))}, true
	}
	if m := reCount.FindStringSubmatch(q); m != nil {
		return one("COUNT(*)", "int64", fmt.Sprint(len(strings.Split(m[1], ",")))), true
	}
	return nil, false
}

func (d *outboxDB) get() (stored string, deleted []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stored, append([]string(nil), d.deleted...)
}

// debeziumTable is the outbox's table map: VARCHAR(36) ascii id, the
// three VARCHAR(255) utf8mb4 columns, the JSON payload.
func debeziumTable() *mysql.TableMap {
	return &mysql.TableMap{Database: "shop", Name: "outbox",
		Types:     []byte{binlog.TypeVarchar, binlog.TypeVarchar, binlog.TypeVarchar, binlog.TypeVarchar, binlog.TypeJSON},
		Metadata:  []uint16{36, 1020, 1020, 1020, 4},
		CanBeNull: mysql.NewServerBitmap(5)}
}

func debeziumRow(id, aggType, aggID, typ string, doc []byte) mysql.Row {
	d := append([]byte{byte(len(id))}, id...)
	for _, s := range []string{aggType, aggID, typ} {
		d = append(d, byte(len(s)), byte(len(s)>>8))
		d = append(d, s...)
	}
	d = append(d, byte(len(doc)), byte(len(doc)>>8), byte(len(doc)>>16), byte(len(doc)>>24))
	d = append(d, doc...)
	return mysql.Row{NullColumns: mysql.NewServerBitmap(5), Data: d}
}

// TestRelay runs the binlog relay (relay/binlog) against the stand-in:
// its SQL connections (go-sql-driver) and its replication connection
// (mysqlrepl) both log in with caching_sha2_password and talk to vitess's
// server. Start checks MySQL's settings and the stored GTID set
// (GTID_SUBSET), probes the dump; the relay then reads two transactions
// of the outbox (one plain, one in a zstd transaction payload), publishes
// their rows with the JSON payloads as MySQL prints them, deletes them,
// and stores the GTID set after them. A stored position the server purged
// stops Start with ErrPositionPurged.
func TestRelay(t *testing.T) {
	s := Start(t, Plugins{Greeting: mysql.CachingSha2Password, SHA2: true}, nil)
	const start = uuidA + ":1-41"
	db := &outboxDB{stored: start, purged: uuidA + ":1-10", executed: uuidA + ":1-43",
		subset: func(a, b string) bool {
			sa, _ := replication.ParseMysql56GTIDSet(a)
			sb, _ := replication.ParseMysql56GTIDSet(b)
			return sb.Contains(sa)
		}}
	s.Match = db.answer
	sid, _ := replication.ParseSID(uuidA)
	prev, _ := replication.ParseMysql56GTIDSet(start)
	doc1 := binlogtest.JSON(binlogtest.Object{{"sku", "A-1"}, {"qty", 2}, {"lines", []any{1.5, "x"}}}, false)
	doc2 := binlogtest.JSON(binlogtest.Object{{"id", 7}, {"paid", true}}, false)
	const id1, id2 = "0b7a3e6c-1111-4c2e-9a8e-6f1d2c3b4a51", "0b7a3e6c-2222-4c2e-9a8e-6f1d2c3b4a52"
	s.Stream = func(c *mysql.Conn, req DumpRequest) error {
		b := NewBinlog()
		events := b.Start("binlog.000003", prev)
		if !req.Set.Contains(mustSet(t, uuidA+":42")) {
			events = append(events, b.GTID(sid, 42), b.Query("shop", "BEGIN"), b.TableMap(9, debeziumTable(), nil),
				b.WriteRows(9, mysql.Rows{DataColumns: allColumns(5), Rows: []mysql.Row{debeziumRow(id1, "Order", "o-1", "OrderPlaced", doc1)}}), b.XID())
		}
		tx := []mysql.BinlogEvent{b.Query("shop", "BEGIN"), b.TableMap(9, debeziumTable(), nil),
			b.WriteRows(9, mysql.Rows{DataColumns: allColumns(5), Rows: []mysql.Row{debeziumRow(id2, "Payment", "p-7", "PaymentReceived", doc2)}}), b.XID()}
		events = append(events, b.GTID(sid, 43), b.Payload(false, tx...))
		return Write(c, events...)
	}

	pub := memory.New()
	url := fmt.Sprintf("mysql://%s:%s@%s/shop", s.User, s.Password, s.Addr)
	r, err := binlogrelay.New(url, pub, binlogrelay.Config{ArchiveRetention: -1, FlushInterval: 10 * time.Millisecond,
		Heartbeat: time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(context.Background()) }()
	defer func() {
		if t.Failed() {
			stored, deleted := db.get()
			t.Logf("stored %q, deleted %v, stats %+v", stored, deleted, r.Stats())
			for _, q := range s.Queries() {
				if strings.HasPrefix(q, "INSERT") || strings.HasPrefix(q, "DELETE") {
					t.Logf("query %q", q)
				}
			}
		}
	}()
	if err := pub.WaitLen(ctx, 2); err != nil {
		t.Fatalf("published %d of 2: %v (%v)", pub.Len(), err, r.Stats())
	}
	msgs := pub.Messages()
	for i, want := range []struct {
		id, aggType, typ string
		payload          string
	}{{id1, "Order", "OrderPlaced", `{"sku": "A-1", "qty": 2, "lines": [1.5, "x"]}`}, {id2, "Payment", "PaymentReceived", `{"id": 7, "paid": true}`}} {
		m := msgs[i]
		var env struct{ Payload json.RawMessage }
		if err := json.Unmarshal(m.Body, &env); err != nil {
			t.Fatal(err)
		}
		if m.EventID.String() != want.id || m.AggregateType != want.aggType || m.EventName != want.typ || !sameJSON(t, env.Payload, []byte(want.payload)) {
			t.Errorf("message %d: %s %s %s %s", i, m.EventID, m.AggregateType, m.EventName, m.Body)
		}
	}
	testsvc.WaitFor(t, 30*time.Second, "the position after both transactions stored", func() bool {
		stored, deleted := db.get()
		return stored == uuidA+":1-43" && len(deleted) == 2
	})
	if _, deleted := db.get(); deleted[0] != "'"+id1+"'" || deleted[1] != "'"+id2+"'" {
		t.Errorf("deleted %v", deleted)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	// The stored position lacks transactions the server purged.
	db.mu.Lock()
	db.stored, db.purged = uuidA+":1-5", uuidA+":1-10"
	db.mu.Unlock()
	r2, err := binlogrelay.New(url, memory.New(), binlogrelay.Config{ArchiveRetention: -1, Logger: slog.New(slog.DiscardHandler), Tables: idem.Tables{}})
	if err != nil {
		t.Fatal(err)
	}
	err = r2.Start(ctx)
	if !errors.Is(err, binlogrelay.ErrPositionPurged) || !strings.Contains(err.Error(), "idem cdc reset-position") {
		t.Fatalf("a purged position: %v", err)
	}
}

func mustSet(t *testing.T, s string) replication.Mysql56GTIDSet {
	t.Helper()
	set, err := replication.ParseMysql56GTIDSet(s)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestRelayFirstStart: at the first start on an outbox whose waiting rows
// the relay cannot tell (Debezium's columns), it stores the server's
// current GTID set (Executed_Gtid_Set, its newlines removed) and reads the
// binlog from there: through SHOW BINARY LOG STATUS on MySQL 8.2 and
// later, through SHOW MASTER STATUS on the earlier servers, which answer
// the first with a syntax error (as the stand-in answers every statement
// it has no answer to).
func TestRelayFirstStart(t *testing.T) {
	for _, status := range []string{"SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"} {
		t.Run(status, func(t *testing.T) {
			s := Start(t, Plugins{Greeting: mysql.CachingSha2Password, SHA2: true}, nil)
			const current = uuidA + ":1-41,\n" + uuidB + ":1-3"
			db := &outboxDB{executed: uuidA + ":1-42," + uuidB + ":1-3",
				subset: func(a, b string) bool { return mustSet(t, b).Contains(mustSet(t, a)) }}
			s.Match = func(q string) (*sqltypes.Result, bool) {
				if q == status {
					return sqltypes.MakeTestResult(sqltypes.MakeTestFields("File|Position|Binlog_Do_DB|Binlog_Ignore_DB|Executed_Gtid_Set",
						"varchar|int64|varchar|varchar|varchar"), "binlog.000003|4096|||"+current), true
				}
				return db.answer(q)
			}
			sid, _ := replication.ParseSID(uuidA)
			doc := binlogtest.JSON(binlogtest.Object{{"n", 1}}, false)
			const id = "0b7a3e6c-3333-4c2e-9a8e-6f1d2c3b4a53"
			s.Stream = func(c *mysql.Conn, req DumpRequest) error {
				b := NewBinlog()
				events := b.Start("binlog.000003", mustSet(t, strings.ReplaceAll(current, "\n", "")))
				if !req.Set.Contains(mustSet(t, uuidA+":42")) {
					events = append(events, b.GTID(sid, 42), b.Query("shop", "BEGIN"), b.TableMap(9, debeziumTable(), nil),
						b.WriteRows(9, mysql.Rows{DataColumns: allColumns(5), Rows: []mysql.Row{debeziumRow(id, "Order", "o-3", "OrderPlaced", doc)}}), b.XID())
				}
				return Write(c, events...)
			}
			pub := memory.New()
			url := fmt.Sprintf("mysql://%s:%s@%s/shop", s.User, s.Password, s.Addr)
			r, err := binlogrelay.New(url, pub, binlogrelay.Config{ArchiveRetention: -1, FlushInterval: 10 * time.Millisecond,
				Heartbeat: time.Second, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = r.Stop(context.Background()) }()
			select {
			case req := <-s.Dumps:
				if want := mustSet(t, strings.ReplaceAll(current, "\n", "")); !req.Set.Equal(want) {
					t.Errorf("the first dump asked from %v, want the server's current set %v", req.Set, want)
				}
			case <-ctx.Done():
				t.Fatal("no dump")
			}
			if err := pub.WaitLen(ctx, 1); err != nil {
				t.Fatalf("published %d of 1: %v (%v)", pub.Len(), err, r.Stats())
			}
			if m := pub.Messages()[0]; m.EventID.String() != id {
				t.Errorf("published %s, want %s", m.EventID, id)
			}
			testsvc.WaitFor(t, 30*time.Second, "the position after the transaction stored", func() bool {
				stored, deleted := db.get()
				return stored != "" && mustSet(t, stored).Equal(mustSet(t, uuidA+":1-42,"+uuidB+":1-3")) && len(deleted) == 1
			})
		})
	}
}
