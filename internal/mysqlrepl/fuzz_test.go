package mysqlrepl

import (
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/idem-go/idem/internal/mysqlrepl/binlogtest"
	"time"
)

// FuzzParseEvent parses a stream of events: the input is cut into events
// by their size fields, after a format description with or without
// checksums (MariaDB's; the MySQL seeds begin with MySQL's). With fixCRC, each event's CRC is recomputed so that the
// fuzzer reaches the decoders behind the checksum. Rows events are
// decoded. Nothing may panic, and what decodes must be consistent.
func FuzzParseEvent(f *testing.F) {
	cols := allColumns()
	n := len(cols)
	tm := tableMapBody(5, "db", "t", cols, true, 0)
	fullRow := row(n, []int{1, 2, 3}, le(1, 8), encDecimal("-3.50", 10, 2), encDateTime2(2024, 5, 6, 7, 8, 9, 123456, 6),
		append(be(1700000000, 4), be(500, 2)...), encTime2(true, 1, 2, 3, 0, 0), le(2024<<9|5<<5|6, 3),
		[]byte{1}, []byte{3}, []byte{5}, le(0, 8), append([]byte{3}, "abc"...), []byte{124})
	gtid := append(binary.LittleEndian.AppendUint64(nil, 5), 0, 0, 0, 0, 2)
	gtid = binary.LittleEndian.AppendUint64(gtid, 9)
	for _, crc := range []bool{false, true} {
		stream := func(events ...[]byte) []byte {
			var b []byte
			for _, e := range events {
				b = append(b, e...)
			}
			return b
		}
		f.Add(stream(
			event(RotateEventType, 0, FlagArtificial, append(le(4, 8), "mariadb-bin.000001"...), crc),
			event(GTIDEventType, 1, 0, gtid, crc),
			event(TableMapEventType, 2, 0, tm, crc),
			event(WriteRowsV1EventType, 3, 0, rowsBody(5, n, false, fullRow, fullRow), crc),
			event(UpdateRowsV1EventType, 4, 0, rowsBody(5, n, true, fullRow, fullRow), crc),
			event(XIDEventType, 5, 0, le(7, 8), crc),
		), crc, false)
		f.Add(stream(
			event(QueryEventType, 1, 0, queryBody(1, "db", []byte{0, 0, 0, 0, 0}, "BEGIN"), crc),
			event(GTIDListEventType, 2, 0, append(le(1, 4), make([]byte, 16)...), crc),
			event(HeartbeatEventType, 3, 0, []byte("f"), crc),
			event(AnnotateRowsEventType, 3, 0, []byte("INSERT"), crc),
		), crc, true)
	}
	// MySQL 8: its format description, then its own events.
	prev, _ := ParseGTIDSet(uuidA + ":1-41")
	mcols := []col{{typ: TypeLong, name: "id"}, {typ: TypeJSON, meta: []byte{4}, name: "payload"}}
	doc := binlogtest.JSON(binlogtest.Object{{"a", []any{1, "b", 2.5}}}, false)
	mrow := row(2, nil, le(1, 4), append(le(uint64(len(doc)), 4), doc...))
	for _, crc := range []bool{false, true} {
		var b []byte
		for _, e := range [][]byte{
			mysqlFDE(crc),
			event(MySQLPreviousGTIDsEventType, 200, 0, prev.Encode(), crc),
			event(MySQLGTIDEventType, 300, 0, binlogtest.GTIDBody(SID{1}, 42, time.Unix(1700000000, 0)), crc),
			event(TableMapEventType, 400, 0, tableMapBody(9, "db", "outbox", mcols, false), crc),
			event(WriteRowsV2EventType, 500, 0, rowsV2Body(9, 2, []byte{1, 2, 3}, mrow), crc),
			event(MySQLTransactionPayloadEventType, 600, 0, payloadBody(f, false, innerEvent(TableMapEventType, tableMapBody(9, "db", "outbox", mcols, false)), innerEvent(WriteRowsV2EventType, rowsV2Body(9, 2, nil, mrow))), crc),
			event(MySQLHeartbeatV2EventType, 0, 0, binlogtest.HeartbeatV2Body("binlog.000001", 700), crc),
		} {
			b = append(b, e...)
		}
		f.Add(b, crc, false)
	}
	f.Add(fde(true), true, true)
	f.Fuzz(func(t *testing.T, data []byte, checksum, fixCRC bool) {
		data = append([]byte(nil), data...) // the size and CRC fixes write to it
		p := newParser(t, checksum)
		for range 16 {
			if len(data) < HeaderLen {
				return
			}
			size := int(binary.LittleEndian.Uint32(data[9:]))
			if size < HeaderLen || size > len(data) {
				size = len(data)
				binary.LittleEndian.PutUint32(data[9:], uint32(size))
			}
			e := data[:size:size]
			data = data[size:]
			if fixCRC && size >= HeaderLen+4 {
				binary.LittleEndian.PutUint32(e[size-4:], crc32.ChecksumIEEE(e[:size-4]))
			}
			ev, err := p.Parse(e)
			if err != nil {
				continue
			}
			h := ev.EventHeader()
			if h.Type != EventType(e[4]) || int(h.Size) != size {
				t.Fatalf("header %+v from %x", h, e[:HeaderLen])
			}
			if r, ok := ev.(*RowsEvent); ok {
				checkRows(t, r)
			}
		}
	})
}

func checkRows(t *testing.T, r *RowsEvent) {
	before, after, err := r.Images()
	if err != nil {
		return
	}
	for _, img := range [][][]any{before, after} {
		for _, row := range img {
			if len(row) != len(r.Table.Columns) {
				t.Fatalf("row of %d values for %d columns", len(row), len(r.Table.Columns))
			}
		}
	}
	if r.Kind == Update && len(before) != len(after) {
		t.Fatalf("update with %d before and %d after images", len(before), len(after))
	}
}

// FuzzRows decodes row images against a table of fuzzed column types and
// metadata: the table map is built around them, all columns present.
func FuzzRows(f *testing.F) {
	cols := allColumns()
	var types, meta []byte
	for _, c := range cols {
		types = append(types, c.typ)
		meta = append(meta, c.meta...)
	}
	fullRow := row(len(cols), []int{1, 2, 3}, le(1, 8), encDecimal("-3.50", 10, 2), encDateTime2(2024, 5, 6, 7, 8, 9, 123456, 6),
		append(be(1700000000, 4), be(500, 2)...), encTime2(true, 1, 2, 3, 0, 0), le(2024<<9|5<<5|6, 3),
		[]byte{1}, []byte{3}, []byte{5}, le(0, 8), append([]byte{3}, "abc"...), []byte{124})
	f.Add(types, meta, fullRow, byte(0))
	f.Add(types, meta, append(fullRow, fullRow...), byte(1))
	f.Add([]byte{TypeNewDecimal}, []byte{65, 30}, append([]byte{0}, encDecimal("-1.5", 65, 30)...), byte(2))
	f.Add([]byte{TypeTime2, TypeDateTime2, TypeTimestamp2}, []byte{3, 6, 1}, append([]byte{0}, append(encTime2(true, 0, 0, 1, 500000, 3), encDateTime2(9999, 12, 31, 23, 59, 59, 999999, 6)...)...), byte(0))
	f.Add([]byte{TypeString, TypeString, TypeBit, TypeBlob}, []byte{TypeEnum, 2, 0xce, 0xfc, 2, 1, 4}, []byte{0, 1, 0, 1, 0, 'a', 3, 0xff, 1, 0, 0, 0, 'b'}, byte(1))
	f.Fuzz(func(t *testing.T, types, meta, rows []byte, kind byte) {
		if len(types) == 0 || len(types) > 64 {
			return
		}
		var tm []byte
		tm = append(tm, 5, 0, 0, 0, 0, 0, 0, 0, 2, 'd', 'b', 0, 1, 't', 0)
		tm = append(tm, lenenc(len(types))...)
		tm = append(tm, types...)
		tm = append(tm, lenenc(len(meta))...)
		tm = append(tm, meta...)
		nulls := make([]byte, (len(types)+7)/8)
		for i := range nulls {
			nulls[i] = 0xff
		}
		tm = append(tm, nulls...)
		p := newParser(t, false)
		if _, err := p.Parse(event(TableMapEventType, 1, 0, tm, false)); err != nil {
			return
		}
		typ := []EventType{WriteRowsV1EventType, UpdateRowsV1EventType, DeleteRowsV1EventType}[int(kind)%3]
		ev, err := p.Parse(event(typ, 2, 0, rowsBody(5, len(types), typ == UpdateRowsV1EventType, rows), false))
		if err != nil {
			t.Fatalf("rows event around a valid table map: %v", err)
		}
		checkRows(t, ev.(*RowsEvent))
	})
}

// FuzzPosition checks that what ParsePosition accepts prints back to
// itself and contains its own entries.
func FuzzPosition(f *testing.F) {
	for _, s := range []string{"", "0-1-100", "0-1-100,2-7-5", " 1-2-3 , 0-1-1", "4294967295-4294967295-18446744073709551615", "0-1-2,0-1-3", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePosition(s)
		if err != nil {
			return
		}
		q, err := ParsePosition(p.String())
		if err != nil || q.String() != p.String() {
			t.Fatalf("%q -> %q -> %q, %v", s, p, q, err)
		}
		gtids := p.GTIDs()
		for i, g := range gtids {
			if !p.Contains(g) || (g.Seq < ^uint64(0) && p.Contains(GTID{Domain: g.Domain, Seq: g.Seq + 1})) {
				t.Fatalf("%s: Contains(%s) wrong", p, g)
			}
			if i > 0 && gtids[i-1].Domain >= g.Domain {
				t.Fatalf("%s: domains not ascending", p)
			}
		}
	})
}
