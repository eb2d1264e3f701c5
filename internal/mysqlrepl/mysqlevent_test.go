package mysqlrepl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/mysqlrepl/binlogtest"
)

// mysqlPostHeaderLens are post-header lengths as a MySQL 8.0 format
// description gives them, up to HEARTBEAT_LOG_EVENT_V2 (41): QUERY 13,
// ROTATE 8, TABLE_MAP 8, rows v1 8, rows v2 10, GTID 42,
// TRANSACTION_PAYLOAD 40.
var mysqlPostHeaderLens = []byte{
	56, 13, 0, 8, 0, 18, 0, 4, 4, 4, 4, 18, 0, 0, 98, 0, 4, 26, 8, 0,
	0, 0, 8, 8, 8, 2, 0, 0, 0, 10, 10, 10, 42, 42, 0, 18, 52, 0, 0, 40, 0,
}

// mysqlFDE returns a FORMAT_DESCRIPTION_EVENT of a MySQL 8.0 binlog.
func mysqlFDE(checksum bool) []byte { return fdeOf("8.0.36", mysqlPostHeaderLens, checksum) }

func newMySQLParser(t testing.TB, checksum bool) *Parser {
	t.Helper()
	p := NewParser()
	if _, err := p.Parse(mysqlFDE(checksum)); err != nil {
		t.Fatalf("parse the MySQL FDE: %v", err)
	}
	return p
}

// tlv returns a type-length-value header of packed integers, ended.
func tlv(fields ...[2]uint64) []byte {
	var fs []binlogtest.Field
	for _, f := range fields {
		fs = append(fs, binlogtest.Field{Type: f[0], Value: f[1]})
	}
	return binlogtest.TLV(fs...)
}

// payloadBody returns a TRANSACTION_PAYLOAD_EVENT body holding events.
func payloadBody(_ testing.TB, none bool, events ...[]byte) []byte {
	return binlogtest.PayloadBody(none, events...)
}

func TestMySQLEvents(t *testing.T) {
	sid := mustSID(t, uuidA)
	commit := time.Date(2025, 3, 4, 5, 6, 7, 891000, time.UTC)
	prev, _ := ParseGTIDSet(uuidA + ":1-41," + uuidB + ":1-3")
	cols := []col{
		{typ: TypeLong, name: "id", unsigned: true},
		{typ: TypeJSON, meta: []byte{4}, name: "payload", nullable: true},
		{typ: TypeVarchar, meta: le(1020, 2), name: "aggregatetype"},
		{typ: TypeYear, name: "y"},
	}
	doc := binlogtest.JSON(binlogtest.Object{{"a", 1}, {"bc", []any{"x", 2.5}}}, false)
	img := row(len(cols), nil, le(7, 4), append(le(uint64(len(doc)), 4), doc...), append(le(5, 2), "Order"...), []byte{125})
	for _, crc := range []bool{false, true} {
		p := newMySQLParser(t, crc)
		if !p.mysql {
			t.Fatal("a MySQL FDE did not make the parser MySQL's")
		}
		evs := parseAll(t, p,
			event(MySQLPreviousGTIDsEventType, 200, 0, prev.Encode(), crc),
			event(MySQLGTIDEventType, 300, 0, binlogtest.GTIDBody(sid, 42, commit), crc),
			event(QueryEventType, 400, 0, queryBody(1, "db", nil, "BEGIN"), crc),
			event(TableMapEventType, 500, 0, tableMapBody(9, "db", "outbox", cols, false), crc),
			event(WriteRowsV2EventType, 600, 0, rowsV2Body(9, len(cols), []byte{0, 1, 2, 3}, img), crc),
			event(XIDEventType, 700, 0, le(5, 8), crc),
			event(MySQLAnonymousGTIDEventType, 800, 0, binlogtest.GTIDBody(SID{}, 0, commit), crc),
			event(MySQLHeartbeatV2EventType, 0, 0, binlogtest.HeartbeatV2Body("binlog.000007", 1<<33), crc),
		)
		if e := evs[0].(*PreviousGTIDsEvent); e.GTIDs.String() != prev.String() {
			t.Errorf("previous GTIDs %s, want %s", e.GTIDs, prev)
		}
		g := evs[1].(*MySQLGTIDEvent)
		if g.SID != sid || g.GNO != 42 || g.Anonymous || g.LastCommitted != 4 || g.SequenceNumber != 5 || !g.ImmediateCommit.Equal(commit) || g.GTIDFlags != 1 {
			t.Errorf("GTID event %+v", g)
		}
		rows, err := evs[4].(*RowsEvent).Rows()
		if err != nil || len(rows) != 1 {
			t.Fatalf("rows: %v, %v", rows, err)
		}
		if r := rows[0]; r[0] != uint64(7) && r[0] != int64(7) || string(r[1].([]byte)) != `{"a": 1, "bc": ["x", 2.5]}` || string(r[2].([]byte)) != "Order" || r[3] != int64(2025) {
			t.Errorf("row %v (payload %s)", r, r[1])
		}
		if a := evs[6].(*MySQLGTIDEvent); !a.Anonymous || a.GNO != 0 {
			t.Errorf("anonymous GTID %+v", a)
		}
		if h := evs[7].(*HeartbeatEvent); h.File != "binlog.000007" || h.LogPos != 1<<33 {
			t.Errorf("heartbeat v2 %+v", h)
		}
	}
}

// rowsV2Body returns a WRITE_ROWS v2 body with extra data (MySQL 8 writes
// 2 bytes of length, then typed extra data, here a partition id).
func rowsV2Body(id uint64, n int, extra []byte, images ...[]byte) []byte {
	v1 := rowsBody(id, n, false, images...)
	b := append([]byte{}, v1[:8]...)
	b = binary.LittleEndian.AppendUint16(b, uint16(2+len(extra)))
	b = append(b, extra...)
	return append(b, v1[8:]...)
}

// TestMySQLTableMapMetadata reads MySQL's optional metadata: signedness
// without YEAR (MySQL's is_numeric_type), the default charset with an
// exception, the collation of each character column.
func TestMySQLTableMapMetadata(t *testing.T) {
	cols := []col{
		{typ: TypeYear, name: "y"},
		{typ: TypeLong, name: "n", unsigned: true},
		{typ: TypeVarchar, meta: le(1020, 2), name: "s"},
		{typ: TypeBlob, meta: []byte{2}, name: "b"},
		{typ: TypeJSON, meta: []byte{4}, name: "j"},
		{typ: TypeString, meta: []byte{TypeEnum, 1}, name: "e"},
	}
	body := tableMapBody(3, "db", "t", cols, false)
	field := func(typ byte, v []byte) {
		body = append(body, typ)
		body = append(body, lenenc(len(v))...)
		body = append(body, v...)
	}
	field(optSignedness, []byte{0x80}) // one numeric column for MySQL: n
	// utf8mb4_0900_ai_ci (255) by default; the second character column
	// (the BLOB) binary.
	field(optDefaultCharset, []byte{0xfc, 255, 0, 1, CollationBinary})
	field(optColumnName, []byte("\x01y\x01n\x01s\x01b\x01j\x01e"))
	p := newMySQLParser(t, true)
	ev, err := p.Parse(event(TableMapEventType, 9, 0, body, true))
	if err != nil {
		t.Fatal(err)
	}
	tm := ev.(*TableMapEvent)
	got := make([]uint16, len(tm.Columns))
	for i, c := range tm.Columns {
		got[i] = c.Collation
	}
	if want := []uint16{0, 0, 255, CollationBinary, 0, 0}; !slicesEqual(got, want) {
		t.Errorf("collations %v, want %v", got, want)
	}
	if tm.Columns[0].Unsigned || !tm.Columns[1].Unsigned {
		t.Errorf("signedness: YEAR %v, INT %v", tm.Columns[0].Unsigned, tm.Columns[1].Unsigned)
	}

	body = tableMapBody(3, "db", "t", cols, false)
	field(optColumnCharset, []byte{0xfc, 0x2d, 0x01, 0x3f}) // 301 (utf8mb4_0900_bin... an id past 255), 63
	if ev, err = p.Parse(event(TableMapEventType, 9, 0, body, true)); err != nil {
		t.Fatal(err)
	}
	if c := ev.(*TableMapEvent).Columns; c[2].Collation != 301 || c[3].Collation != 63 {
		t.Errorf("COLUMN_CHARSET: %d, %d", c[2].Collation, c[3].Collation)
	}

	body = tableMapBody(3, "db", "t", cols, false)
	field(optDefaultCharset, []byte{45, 5, 45})
	if _, err = p.Parse(event(TableMapEventType, 9, 0, body, true)); !errors.Is(err, ErrMalformed) {
		t.Errorf("a charset for a column past the character ones: %v", err)
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// innerEvent returns an event as MySQL stores it inside a transaction
// payload: no checksum, no position.
func innerEvent(t EventType, body []byte) []byte { return event(t, 0, 0, body, false) }

func TestTransactionPayload(t *testing.T) {
	cols := []col{{typ: TypeLong, name: "id"}, {typ: TypeJSON, meta: []byte{4}, name: "payload"}}
	doc := binlogtest.JSON(binlogtest.Object{{"k", "v"}}, false)
	img := row(2, nil, le(1, 4), append(le(uint64(len(doc)), 4), doc...))
	inner := [][]byte{
		innerEvent(QueryEventType, queryBody(1, "db", nil, "BEGIN")),
		innerEvent(TableMapEventType, tableMapBody(4, "db", "outbox", cols, false)),
		innerEvent(WriteRowsV2EventType, rowsV2Body(4, 2, nil, img, img)),
		innerEvent(XIDEventType, le(9, 8)),
	}
	for _, none := range []bool{false, true} {
		p := newMySQLParser(t, true)
		ev, err := p.Parse(event(MySQLTransactionPayloadEventType, 5000, 0, payloadBody(t, none, inner...), true))
		if err != nil {
			t.Fatalf("none %v: %v", none, err)
		}
		e := ev.(*TransactionPayloadEvent)
		if len(e.Events) != 4 {
			t.Fatalf("%d inner events", len(e.Events))
		}
		if q := e.Events[0].(*QueryEvent); q.Query != "BEGIN" || q.NextPos != 5000 {
			t.Errorf("first inner event %+v", q)
		}
		rows, err := e.Events[2].(*RowsEvent).Rows()
		if err != nil || len(rows) != 2 || string(rows[1][1].([]byte)) != `{"k": "v"}` {
			t.Errorf("inner rows %v, %v", rows, err)
		}
		if x := e.Events[3].(*XIDEvent); x.XID != 9 {
			t.Errorf("inner XID %+v", x)
		}
	}

	good := payloadBody(t, false, inner...)
	raw := bytes.Join(inner, nil)
	lying := append(tlv([2]uint64{otwCompressionType, compressionZstd}, [2]uint64{otwUncompressedSize, uint64(len(raw) + 1)}), good[len(good)-(len(good)-bytes.IndexByte(good, otwEndMark)-1):]...)
	for name, body := range map[string][]byte{
		"truncated":         good[:len(good)-3],
		"no end mark":       {otwCompressionType, 1, 0},
		"size mismatch":     append(tlv([2]uint64{otwPayloadSize, 5}), 1, 2),
		"uncompressed size": lying,
		"not zstd":          append(tlv([2]uint64{otwUncompressedSize, 4}), 1, 2, 3, 4),
		"huge":              tlv([2]uint64{otwUncompressedSize, 1 << 40}),
		"inner truncated":   append(tlv([2]uint64{otwCompressionType, compressionNone}), innerEvent(XIDEventType, le(9, 8))[:20]...),
		"inner GTID":        append(tlv([2]uint64{otwCompressionType, compressionNone}), innerEvent(MySQLGTIDEventType, binlogtest.GTIDBody(SID{1}, 1, time.Now()))...),
	} {
		p := newMySQLParser(t, false)
		if _, err := p.Parse(event(MySQLTransactionPayloadEventType, 1, 0, body, false)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	p := newMySQLParser(t, false)
	if _, err := p.Parse(event(MySQLTransactionPayloadEventType, 1, 0, tlv([2]uint64{otwCompressionType, 1}), false)); !errors.Is(err, ErrUnsupported) {
		t.Errorf("an unknown compression: %v, want ErrUnsupported", err)
	}
}

func TestMySQLRefused(t *testing.T) {
	p := newMySQLParser(t, true)
	_, err := p.Parse(event(MySQLPartialUpdateRowsEventType, 1, 0, make([]byte, 30), true))
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "binlog_row_value_options") {
		t.Errorf("PARTIAL_UPDATE_ROWS: %v", err)
	}
	for name, body := range map[string][]byte{
		"short GTID": make([]byte, 10),
		"GNO 0":      binlogtest.GTIDBody(SID{1}, 0, time.Now()),
	} {
		if _, err := p.Parse(event(MySQLGTIDEventType, 1, 0, body, true)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	// A MySQL 5.5 format description (no GTID events) is not read.
	short := mysqlFDE(true)
	var body []byte
	body = append(body, short[HeaderLen:HeaderLen+2+50+4+1]...)
	body = append(body, mysqlPostHeaderLens[:27]...)
	if _, err := NewParser().Parse(event(FormatDescriptionEventType, 1, 0, append(body, 1), true)); !errors.Is(err, ErrUnsupported) {
		t.Errorf("a MySQL 5.5 FDE: %v", err)
	}
}

// FuzzTransactionPayload decodes fuzzed payload events whose inner events
// are fuzzed too (compressed or not): nothing may panic.
func FuzzTransactionPayload(f *testing.F) {
	cols := []col{{typ: TypeLong, name: "id"}, {typ: TypeJSON, meta: []byte{4}, name: "payload"}}
	doc := binlogtest.JSON([]any{1, "x"}, false)
	inner := bytes.Join([][]byte{
		innerEvent(QueryEventType, queryBody(1, "db", nil, "BEGIN")),
		innerEvent(TableMapEventType, tableMapBody(4, "db", "outbox", cols, false)),
		innerEvent(WriteRowsV2EventType, rowsV2Body(4, 2, nil, row(2, nil, le(1, 4), append(le(uint64(len(doc)), 4), doc...)))),
		innerEvent(XIDEventType, le(9, 8)),
	}, nil)
	f.Add(inner, false, []byte(nil))
	f.Add(inner, true, []byte(nil))
	f.Add([]byte(nil), false, payloadBody(f, false, inner))
	f.Fuzz(func(t *testing.T, raw []byte, compress bool, whole []byte) {
		p := newMySQLParser(t, false)
		if whole != nil {
			_, _ = p.Parse(event(MySQLTransactionPayloadEventType, 1, 0, whole, false))
			return
		}
		ev, err := p.Parse(event(MySQLTransactionPayloadEventType, 1, 0, payloadBody(t, !compress, raw), false))
		if err != nil {
			return
		}
		for _, e := range ev.(*TransactionPayloadEvent).Events {
			if r, ok := e.(*RowsEvent); ok {
				checkRows(t, r)
			}
		}
	})
}
