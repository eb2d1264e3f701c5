package mysql8test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"vitess.io/vitess/go/mysql"
	"vitess.io/vitess/go/mysql/binlog"
	"vitess.io/vitess/go/mysql/collations"
	"vitess.io/vitess/go/mysql/replication"
	"vitess.io/vitess/go/mysql/sqlerror"

	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/internal/mysqlrepl/binlogtest"
)

const (
	uuidA = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	uuidB = "7c2f6a3e-0b1d-11ef-8a4b-0242ac120002"
)

// outboxTable is a table map of an outbox as MySQL 8 logs it: BIGINT
// UNSIGNED id, VARCHAR(255) utf8mb4 aggregatetype, JSON payload,
// DATETIME(6) occurred_at, BLOB payload_binary (nullable).
func outboxTable() *mysql.TableMap {
	tm := &mysql.TableMap{Database: "shop", Name: "outbox",
		Types:    []byte{binlog.TypeLongLong, binlog.TypeVarchar, binlog.TypeJSON, binlog.TypeDateTime2, binlog.TypeBlob},
		Metadata: []uint16{0, 1020, 4, 6, 2}, CanBeNull: mysql.NewServerBitmap(5)}
	tm.CanBeNull.Set(4, true)
	return tm
}

// outboxMetadata is the optional metadata of binlog_row_metadata=FULL for
// outboxTable: signedness (id unsigned), the collation of each character
// column (COLUMN_CHARSET: utf8mb4_0900_ai_ci, 255, and binary for the
// BLOB; vitess reads DEFAULT_CHARSET as a flat list of ids, so the
// default-and-exceptions form is left to mysqlrepl's own test), the
// column names.
func outboxMetadata() []byte {
	ai := uint64(collations.MySQL8().LookupByName("utf8mb4_0900_ai_ci"))
	var b []byte
	field := func(typ byte, v []byte) {
		b = append(b, typ)
		b = append(b, binlogtest.Packed(uint64(len(v)))...)
		b = append(b, v...)
	}
	field(1, []byte{0x80})
	field(3, slices.Concat(binlogtest.Packed(ai), binlogtest.Packed(63)))
	var names []byte
	for _, n := range []string{"id", "aggregatetype", "payload", "occurred_at", "payload_binary"} {
		names = append(names, byte(len(n)))
		names = append(names, n...)
	}
	field(4, names)
	return b
}

// outboxRow is a row image of outboxTable (DATETIME2 2025-03-04
// 05:06:07.891000).
func outboxRow(id uint64, typ string, doc []byte) mysql.Row {
	var d []byte
	d = binary.LittleEndian.AppendUint64(d, id)
	d = binary.LittleEndian.AppendUint16(d, uint16(len(typ)))
	d = append(d, typ...)
	d = binary.LittleEndian.AppendUint32(d, uint32(len(doc)))
	d = append(d, doc...)
	ymd := uint64((2025*13+3)<<5 | 4)
	hms := uint64(5<<12 | 6<<6 | 7)
	packed := (ymd<<17|hms)<<24 + 891000
	dt := binary.BigEndian.AppendUint64(nil, packed+0x8000000000<<24)
	d = append(d, dt...) // 5 bytes of date and time, 3 of microseconds
	nulls := mysql.NewServerBitmap(5)
	nulls.Set(4, true)
	return mysql.Row{NullColumns: nulls, Data: d}
}

func allColumns(n int) mysql.Bitmap {
	b := mysql.NewServerBitmap(n)
	for i := range n {
		b.Set(i, true)
	}
	return b
}

// TestDumpGTID dumps from a MySQL GTID set of two sources with gaps: the
// stand-in receives it as vitess decodes COM_BINLOG_DUMP_GTID's binary
// form, and streams a binlog built with vitess's builders: the previous
// GTIDs, a transaction (GTID, BEGIN, table map with FULL metadata, two
// rows with JSON, XID), the same again inside a zstd transaction payload,
// and a heartbeat v2. The reader's values are checked against what vitess
// reads from the same bytes (GTIDs, collations, JSON).
func TestDumpGTID(t *testing.T) {
	s := Start(t, Plugins{Greeting: mysql.CachingSha2Password, SHA2: true}, nil)
	b := NewBinlog()
	docs := [][]byte{
		binlogtest.JSON(binlogtest.Object{{"id", 42}, {"sku", "A-1"}, {"items", []any{binlogtest.Object{{"q", 2}, {"price", 9.5}}}}, {"customer", nil}}, false),
		binlogtest.JSON(binlogtest.Object{{"é", "ünïcode 😀"}, {"big", uint64(1) << 63}, {"when", binlogtest.Opaque{Type: binlog.TypeDateTime, Data: binlogtest.PackedDateTime(2015, 1, 15, 15, 16, 17, 123456)}}}, true),
	}
	prev, _ := replication.ParseMysql56GTIDSet(uuidA + ":1-41")
	sidA, _ := replication.ParseSID(uuidA)
	sidB, _ := replication.ParseSID(uuidB)
	rows := mysql.Rows{DataColumns: allColumns(5), Rows: []mysql.Row{outboxRow(1, "Order", docs[0]), outboxRow(2, "Payment", docs[1])}}
	var events []mysql.BinlogEvent
	events = append(events, b.Start("binlog.000003", prev)...)
	events = append(events, b.GTID(sidA, 42), b.Query("shop", "BEGIN"), b.TableMap(7, outboxTable(), outboxMetadata()),
		b.WriteRows(7, rows), b.XID())
	tx := []mysql.BinlogEvent{b.Query("shop", "BEGIN"), b.TableMap(7, outboxTable(), outboxMetadata()), b.WriteRows(7, rows), b.XID()}
	events = append(events, b.GTID(sidB, 7), b.Payload(false, tx...), b.HeartbeatV2("binlog.000003", 1<<33))
	s.Stream = func(c *mysql.Conn, _ DumpRequest) error { return Write(c, events...) }

	c, err := dial(t, mysqlrepl.Config{Network: "unix", Addr: s.Socket, User: s.User, Password: s.Password})
	if err != nil {
		t.Fatal(err)
	}
	from := uuidB + ":1-3:5-6,\n" + uuidA + ":1-41"
	if err := c.StartDump(context.Background(), from); err != nil {
		t.Fatal(err)
	}
	req := <-s.Dumps
	want, _ := replication.ParseMysql56GTIDSet(from)
	if !req.Set.Equal(want) || req.Flags&4 == 0 {
		t.Fatalf("the stand-in got the GTID set %v (flags %#x), want %v with BINLOG_THROUGH_GTID", req.Set, req.Flags, want)
	}
	for _, q := range []string{"SET @source_binlog_checksum = @@global.binlog_checksum", "SET @master_binlog_checksum = @@global.binlog_checksum"} {
		if !slices.Contains(s.Queries(), q) {
			t.Errorf("the reader did not run %q: %q", q, s.Queries())
		}
	}

	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var got []mysqlrepl.Event
	for range 10 {
		ev, err := c.ReadEvent()
		if err != nil {
			t.Fatalf("event %d: %v", len(got), err)
		}
		got = append(got, ev)
	}
	if r := got[0].(*mysqlrepl.RotateEvent); r.File != "binlog.000003" || r.Flags&mysqlrepl.FlagArtificial == 0 {
		t.Errorf("first event %+v, want the fake rotate", r)
	}
	if f := got[1].(*mysqlrepl.FormatDescriptionEvent); f.ServerVersion != "8.0.36" || !f.Checksum {
		t.Errorf("format description %+v", f)
	}
	if p := got[2].(*mysqlrepl.PreviousGTIDsEvent); p.GTIDs.String() != uuidA+":1-41" {
		t.Errorf("previous GTIDs %s", p.GTIDs)
	}
	f := b.F
	for i, sid := range map[int]replication.SID{3: sidA, 8: sidB} {
		g := got[i].(*mysqlrepl.MySQLGTIDEvent)
		vg, _, _, _, err := mysql.NewMysql56BinlogEvent(events[i].Bytes()).GTID(f)
		if err != nil || g.SID.String() != vg.(replication.Mysql56GTID).Server.String() || int64(g.GNO) != vg.(replication.Mysql56GTID).Sequence || g.SID.String() != sid.String() {
			t.Errorf("GTID event %d: %s:%d, vitess reads %v (%v)", i, g.SID, g.GNO, vg, err)
		}
	}
	checkTx := func(what string, tm *mysqlrepl.TableMapEvent, tmBytes []byte, re *mysqlrepl.RowsEvent) {
		t.Helper()
		stripped, _, err := mysql.NewMysql56BinlogEvent(tmBytes).StripChecksum(f)
		if err != nil {
			t.Fatal(err)
		}
		vtm, err := stripped.TableMap(f)
		if err != nil {
			t.Fatalf("%s: vitess reads the table map: %v", what, err)
		}
		var mine []uint16
		for _, col := range tm.Columns {
			if col.Collation != 0 {
				mine = append(mine, col.Collation)
			}
		}
		var theirs []uint16
		for _, id := range vtm.ColumnCollationIDs {
			theirs = append(theirs, uint16(id))
		}
		if !reflect.DeepEqual(mine, theirs) || mine[0] != 255 || mine[1] != 63 {
			t.Errorf("%s: collations %v, vitess reads %v", what, mine, theirs)
		}
		if tm.Columns[2].Name != "payload" || !tm.Columns[0].Unsigned {
			t.Errorf("%s: columns %+v", what, tm.Columns)
		}
		vals, err := re.Rows()
		if err != nil || len(vals) != 2 {
			t.Fatalf("%s: rows %v, %v", what, vals, err)
		}
		for i, r := range vals {
			vj, err := binlog.ParseBinaryJSON(docs[i])
			if err != nil {
				t.Fatal(err)
			}
			if !sameJSON(t, r[2].([]byte), vj.MarshalTo(nil)) {
				t.Errorf("%s: row %d payload %s, vitess reads %s", what, i, r[2], vj.MarshalTo(nil))
			}
			if r[0] != uint64(i+1) || r[4] != nil || !r[3].(time.Time).Equal(time.Date(2025, 3, 4, 5, 6, 7, 891000000, time.UTC)) {
				t.Errorf("%s: row %d %v", what, i, r)
			}
		}
		if s := string(vals[0][2].([]byte)); s != `{"id": 42, "sku": "A-1", "items": [{"q": 2, "price": 9.5}], "customer": null}` {
			t.Errorf("%s: the first payload as MySQL prints it: %s", what, s)
		}
		if s := string(vals[1][2].([]byte)); s != `{"é": "ünïcode 😀", "big": 9223372036854775808, "when": "2015-01-15 15:16:17.123456"}` {
			t.Errorf("%s: the second payload as MySQL prints it: %s", what, s)
		}
	}
	checkTx("transaction", got[5].(*mysqlrepl.TableMapEvent), events[5].Bytes(), got[6].(*mysqlrepl.RowsEvent))
	if _, ok := got[7].(*mysqlrepl.XIDEvent); !ok {
		t.Errorf("event 7 %T, want the XID", got[7])
	}
	p := got[9].(*mysqlrepl.TransactionPayloadEvent)
	if len(p.Events) != 4 || p.Compression != binlogtest.CompressionZstd {
		t.Fatalf("payload of %d events, compression %d", len(p.Events), p.Compression)
	}
	checkTx("payload", p.Events[1].(*mysqlrepl.TableMapEvent), tx[1].Bytes(), p.Events[2].(*mysqlrepl.RowsEvent))
	ev, err := c.ReadEvent()
	if h, ok := ev.(*mysqlrepl.HeartbeatEvent); err != nil || !ok || h.File != "binlog.000003" || h.LogPos != 1<<33 {
		t.Errorf("heartbeat v2: %#v, %v", ev, err)
	}
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

// TestDumpPurged: a GTID set the server cannot serve is refused with
// error 1236 on the first read, which the reader reports as purged.
func TestDumpPurged(t *testing.T) {
	s := Start(t, Plugins{Greeting: mysql.CachingSha2Password, SHA2: true}, nil)
	const msg = "Cannot replicate because the source purged required binary logs. Replicate the missing transactions from elsewhere, or provision a new replica from backup. Consider increasing the source's binary log expiration period. The GTID set sent by the replica is '" + uuidA + ":1-5', and the missing transactions are '" + uuidA + ":6-9'"
	s.Stream = func(*mysql.Conn, DumpRequest) error {
		return sqlerror.NewSQLError(mysqlrepl.ErrCodeBinlogUnavailable, "HY000", msg)
	}
	c, err := dial(t, mysqlrepl.Config{Network: "unix", Addr: s.Socket, User: s.User, Password: s.Password})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartDump(context.Background(), uuidA+":1-5"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = c.ReadEvent()
	if !mysqlrepl.IsPurged(err) || !strings.Contains(err.Error(), "purged required binary logs") {
		t.Fatalf("%v, want error 1236", err)
	}
	if err := c.StartDump(context.Background(), uuidA+":tag:1"); err == nil {
		t.Error("StartDump after a dump")
	}
}

// TestRealMySQLPayload decodes the TRANSACTION_PAYLOAD_EVENT that vitess
// captured from MySQL 8 for its own tests (go/mysql/large_compressed_trx_payload.bin
// in vitess's module: an insert of a 173 MB LONGTEXT, compressed to 16
// KiB), read from the module cache: bytes a real MySQL server wrote.
func TestRealMySQLPayload(t *testing.T) {
	raw := vitessFile(t, "go/mysql/large_compressed_trx_payload.bin")
	// The file holds the event without its CRC32 (its header counts it):
	// append one.
	raw = binary.LittleEndian.AppendUint32(raw, crc32.ChecksumIEEE(raw))
	p := mysqlrepl.NewParser()
	fde := NewBinlog()
	if _, err := p.Parse(mysql.NewFormatDescriptionEvent(fde.F, fde.S).Bytes()); err != nil {
		t.Fatal(err)
	}
	ev, err := p.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	e := ev.(*mysqlrepl.TransactionPayloadEvent)
	if len(e.Events) != 4 {
		t.Fatalf("%d inner events", len(e.Events))
	}
	if q := e.Events[0].(*mysqlrepl.QueryEvent); q.Query != "BEGIN" {
		t.Errorf("first inner event %q", q.Query)
	}
	tm := e.Events[1].(*mysqlrepl.TableMapEvent)
	if tm.Schema != "vt_commerce" || tm.Table != "customer" {
		t.Errorf("table map of %s.%s", tm.Schema, tm.Table)
	}
	rows, err := e.Events[2].(*mysqlrepl.RowsEvent).Rows()
	if err != nil || len(rows) != 1 {
		t.Fatalf("rows: %v", err)
	}
	r := rows[0]
	text := r[2].([]byte)
	if r[0] != int64(1) || string(r[1].([]byte)) != "mlord@planetscale.com" || len(text) != 4*43280000 || !bytes.Equal(text[:8], []byte("testtest")) {
		t.Errorf("row %v %q, %d bytes of %q...", r[0], r[1], len(text), text[:min(8, len(text))])
	}
	if _, ok := e.Events[3].(*mysqlrepl.XIDEvent); !ok {
		t.Errorf("last inner event %T", e.Events[3])
	}
}

// vitessFile reads a file of vitess's module, from the module cache.
func vitessFile(t *testing.T, name string) []byte {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "vitess.io/vitess").Output()
	if err != nil {
		t.Fatalf("go list -m vitess.io/vitess: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
