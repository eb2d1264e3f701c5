package mysqlrepl

import (
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestFormatDescription(t *testing.T) {
	for _, checksum := range []bool{true, false} {
		p := NewParser()
		ev, err := p.Parse(fde(checksum))
		if err != nil {
			t.Fatalf("checksum %v: %v", checksum, err)
		}
		e := ev.(*FormatDescriptionEvent)
		if e.BinlogVersion != 4 || e.ServerVersion != "10.11.6-MariaDB-log" || e.Checksum != checksum || e.Type != FormatDescriptionEventType {
			t.Errorf("checksum %v: got %+v", checksum, e)
		}
		if e.NextPos != 256 || e.Timestamp != time.Unix(1700000000, 0).UTC() || e.ServerID != 1 {
			t.Errorf("header: %+v", e.Header)
		}
	}

	bad := fde(true)
	bad[30] ^= 1
	if _, err := NewParser().Parse(bad); !errors.Is(err, ErrChecksum) {
		t.Errorf("FDE with a bad CRC: %v, want ErrChecksum", err)
	}
	alg := fde(true)
	alg[len(alg)-5] = 2
	if _, err := NewParser().Parse(alg); !errors.Is(err, ErrUnsupported) {
		t.Errorf("FDE with algorithm 2: %v, want ErrUnsupported", err)
	}
	v3 := fde(false)
	v3[HeaderLen] = 3
	if _, err := NewParser().Parse(v3); !errors.Is(err, ErrUnsupported) {
		t.Errorf("binlog version 3: %v, want ErrUnsupported", err)
	}
}

func TestChecksum(t *testing.T) {
	p := newParser(t, true)
	xid := event(XIDEventType, 500, 0, binary.LittleEndian.AppendUint64(nil, 77), true)
	ev, err := p.Parse(xid)
	if err != nil {
		t.Fatal(err)
	}
	if ev.(*XIDEvent).XID != 77 {
		t.Errorf("XID %d", ev.(*XIDEvent).XID)
	}
	for _, i := range []int{0, 4, 10, HeaderLen, len(xid) - 1} {
		bad := append([]byte(nil), xid...)
		bad[i] ^= 0x40
		_, err := p.Parse(bad)
		if i == 10 { // the size: caught before the CRC
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("size byte flipped: %v, want ErrMalformed", err)
			}
			continue
		}
		if !errors.Is(err, ErrChecksum) {
			t.Errorf("byte %d flipped: %v, want ErrChecksum", i, err)
		}
	}
	// The error names the file and the position.
	parseAll(t, p, event(RotateEventType, 0, 0, append(binary.LittleEndian.AppendUint64(nil, 4), "bin.000002"...), true))
	bad := append([]byte(nil), xid...)
	bad[HeaderLen] ^= 1
	if _, err := p.Parse(bad); err == nil || !strings.Contains(err.Error(), "bin.000002:500") || !strings.HasPrefix(err.Error(), "idem: mysqlrepl: ") {
		t.Errorf("error %q does not name bin.000002:500", err)
	}

	// Without checksums, the last 4 bytes are the body's.
	p = newParser(t, false)
	ev, err = p.Parse(event(XIDEventType, 500, 0, binary.LittleEndian.AppendUint64(nil, 78), false))
	if err != nil || ev.(*XIDEvent).XID != 78 {
		t.Errorf("no checksum: %v %v", ev, err)
	}
}

func TestRotate(t *testing.T) {
	body := append(binary.LittleEndian.AppendUint64(nil, 4), "mariadb-bin.000007"...)
	for _, crc := range []bool{true, false} {
		// Before any FDE (the fake rotate at the start of a dump), with or
		// without a CRC.
		p := NewParser()
		ev, err := p.Parse(event(RotateEventType, 0, FlagArtificial, body, crc))
		if err != nil {
			t.Fatal(err)
		}
		e := ev.(*RotateEvent)
		if e.Pos != 4 || e.File != "mariadb-bin.000007" || e.Flags != FlagArtificial || p.File() != e.File {
			t.Errorf("crc %v: %+v", crc, e)
		}
	}
	// A known checksum mode is enforced before the FDE too.
	p := &Parser{checksum: checksumOn}
	if _, err := p.Parse(event(RotateEventType, 0, FlagArtificial, body, false)); !errors.Is(err, ErrChecksum) {
		t.Errorf("rotate without its CRC: %v, want ErrChecksum", err)
	}
}

func TestGTID(t *testing.T) {
	p := newParser(t, true)
	var body []byte
	body = binary.LittleEndian.AppendUint64(body, 123456789)
	body = binary.LittleEndian.AppendUint32(body, 3)
	body = append(body, gtidStandalone|0x20)
	body = append(body, 0, 0, 0, 0, 0, 0) // padding as MariaDB writes it
	ev := parseAll(t, p, event(GTIDEventType, 900, 8, body, true))[0].(*GTIDEvent)
	want := GTID{Domain: 3, Server: 1, Seq: 123456789}
	if ev.GTID() != want || !ev.Standalone || ev.CommitID != 0 || ev.GTIDFlags != 0x21 {
		t.Errorf("got %+v", ev)
	}

	body = binary.LittleEndian.AppendUint64(nil, 5)
	body = binary.LittleEndian.AppendUint32(body, 0)
	body = append(body, gtidGroupCommitID|0x4)
	body = binary.LittleEndian.AppendUint64(body, 42)
	ev = parseAll(t, p, event(GTIDEventType, 900, 8, body, true))[0].(*GTIDEvent)
	if ev.Standalone || ev.CommitID != 42 || ev.Seq != 5 {
		t.Errorf("got %+v", ev)
	}
	// The commit id announced but missing.
	if _, err := p.Parse(event(GTIDEventType, 900, 8, body[:14], true)); !errors.Is(err, ErrMalformed) {
		t.Errorf("truncated commit id: %v", err)
	}
}

func TestGTIDList(t *testing.T) {
	p := newParser(t, true)
	want := []GTID{{0, 1, 100}, {2, 7, 5}}
	body := binary.LittleEndian.AppendUint32(nil, uint32(len(want)))
	for _, g := range want {
		body = binary.LittleEndian.AppendUint32(body, g.Domain)
		body = binary.LittleEndian.AppendUint32(body, g.Server)
		body = binary.LittleEndian.AppendUint64(body, g.Seq)
	}
	ev := parseAll(t, p, event(GTIDListEventType, 300, 0, body, true))[0].(*GTIDListEvent)
	if !reflect.DeepEqual(ev.GTIDs, want) {
		t.Errorf("got %v", ev.GTIDs)
	}
	// A count larger than the entries: an error, not a huge allocation.
	huge := binary.LittleEndian.AppendUint32(nil, 0x0fffffff)
	if _, err := p.Parse(event(GTIDListEventType, 300, 0, huge, true)); !errors.Is(err, ErrMalformed) {
		t.Errorf("huge count: %v", err)
	}
}

func queryBody(thread uint32, schema string, status []byte, query string) []byte {
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, thread)
	b = binary.LittleEndian.AppendUint32(b, 2) // exec time
	b = append(b, byte(len(schema)))
	b = binary.LittleEndian.AppendUint16(b, 0) // error code
	b = binary.LittleEndian.AppendUint16(b, uint16(len(status)))
	b = append(b, status...)
	b = append(b, schema...)
	b = append(b, 0)
	return append(b, query...)
}

func TestQuery(t *testing.T) {
	p := newParser(t, true)
	// Status variables as MariaDB writes them (flags2, sql_mode, catalog,
	// charset...): skipped whole by their length.
	status := []byte{0, 0, 0, 0, 0, 1, 0, 0, 32, 0x50, 0, 0, 0, 0, 6, 3, 's', 't', 'd', 4, 33, 0, 33, 0, 8, 0, 0xff}
	ev := parseAll(t, p, event(QueryEventType, 1000, 0, queryBody(9, "shop", status, "CREATE TABLE t (id INT)"), true))[0].(*QueryEvent)
	if ev.ThreadID != 9 || ev.ExecTime != 2 || ev.Schema != "shop" || ev.Query != "CREATE TABLE t (id INT)" {
		t.Errorf("got %+v", ev)
	}
	// Status variables longer than the event.
	b := queryBody(9, "shop", nil, "")
	binary.LittleEndian.PutUint16(b[11:], 500)
	if _, err := p.Parse(event(QueryEventType, 1000, 0, b, true)); !errors.Is(err, ErrMalformed) {
		t.Errorf("long status variables: %v", err)
	}
}

func TestHeartbeatAndOther(t *testing.T) {
	p := newParser(t, true)
	ev := parseAll(t, p, event(HeartbeatEventType, 3130, 0, []byte("mariadb-bin.000001"), true))[0].(*HeartbeatEvent)
	if ev.File != "mariadb-bin.000001" || ev.NextPos != 3130 {
		t.Errorf("got %+v", ev)
	}
	for _, typ := range []EventType{AnnotateRowsEventType, BinlogCheckpointEventType, StartEncryptionEventType,
		UserVarEventType, IntvarEventType, RandEventType, StopEventType, XAPrepareEventType} {
		ev, err := p.Parse(event(typ, 77, 0, []byte("body"), true))
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		o, ok := ev.(*OtherEvent)
		if !ok || o.Type != typ || string(o.Body) != "body" || o.NextPos != 77 {
			t.Errorf("%s: got %#v", typ, ev)
		}
	}
}

func TestRefused(t *testing.T) {
	p := newParser(t, true)
	for typ, want := range map[EventType]string{
		QueryCompressedEventType:        "log_bin_compress",
		WriteRowsCompressedV1EventType:  "log_bin_compress",
		DeleteRowsCompressedEventType:   "log_bin_compress",
		MySQLPartialUpdateRowsEventType: "PARTIAL_JSON",
		MySQLGTIDTaggedEventType:        "tagged",
		EventType(50):                   "unknown",
		EventType(200):                  "unknown",
	} {
		_, err := p.Parse(event(typ, 1, 0, make([]byte, 40), true))
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ErrUnsupported mentioning %q", typ, err, want)
		}
	}
}

func TestMalformedHeader(t *testing.T) {
	p := newParser(t, true)
	if _, err := p.Parse(make([]byte, 10)); !errors.Is(err, ErrMalformed) {
		t.Errorf("short: %v", err)
	}
	e := event(XIDEventType, 1, 0, make([]byte, 8), true)
	if _, err := p.Parse(e[:len(e)-1]); !errors.Is(err, ErrMalformed) {
		t.Errorf("size mismatch: %v", err)
	}
	// Too short for a checksum.
	e = event(XIDEventType, 1, 0, []byte{1, 2}, false)
	if _, err := p.Parse(e); !errors.Is(err, ErrMalformed) {
		t.Errorf("no room for a checksum: %v", err)
	}
}

// TestTruncated parses every prefix of valid events: each is an error,
// never a panic.
func TestTruncated(t *testing.T) {
	cols := allColumns()
	events := [][]byte{
		fde(true),
		event(GTIDEventType, 1, 0, append(binary.LittleEndian.AppendUint64(nil, 5), 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0), true),
		event(QueryEventType, 1, 0, queryBody(1, "db", []byte{1, 2, 3}, "BEGIN"), true),
		event(TableMapEventType, 1, 0, tableMapBody(5, "db", "t", cols, true, 0), true),
	}
	for _, e := range events {
		p := newParser(t, true)
		for n := range len(e) {
			cut := append([]byte(nil), e[:n]...)
			if n >= 13 {
				binary.LittleEndian.PutUint32(cut[9:], uint32(n))
			}
			if _, err := p.Parse(cut); err == nil {
				t.Errorf("%s cut at %d: no error", EventType(e[4]), n)
			}
		}
	}
	// The same without checksums: the cut lands in the body itself.
	for _, e := range [][]byte{
		event(TableMapEventType, 1, 0, tableMapBody(5, "db", "t", cols, true, 0), false),
		event(QueryEventType, 1, 0, queryBody(1, "db", []byte{1, 2, 3}, ""), false),
	} {
		for n := HeaderLen; n < len(e); n++ {
			p := newParser(t, false)
			cut := append([]byte(nil), e[:n]...)
			binary.LittleEndian.PutUint32(cut[9:], uint32(n))
			ev, err := p.Parse(cut)
			// Optional metadata may end at a field boundary, the query at
			// any byte: those are valid events; the rest must fail.
			if err == nil {
				if tm, ok := ev.(*TableMapEvent); ok && len(tm.Columns) != len(cols) {
					t.Errorf("table map cut at %d: %d columns", n, len(tm.Columns))
				}
			}
		}
	}
}
