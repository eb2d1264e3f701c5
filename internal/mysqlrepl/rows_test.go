package mysqlrepl

import (
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// encDecimal encodes s as DECIMAL(prec, scale) the way the server does
// (decimal2bin).
func encDecimal(s string, prec, scale int) []byte {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	ip, fp, _ := strings.Cut(s, ".")
	ip = strings.TrimLeft(ip, "0")
	intg := prec - scale
	digits := strings.Repeat("0", intg-len(ip)) + ip + fp + strings.Repeat("0", scale-len(fp))
	var out []byte
	pos := 0
	put := func(nd int) {
		v, _ := strconv.ParseUint(digits[pos:pos+nd], 10, 64)
		pos += nd
		for i := dig2bytes[nd] - 1; i >= 0; i-- {
			out = append(out, byte(v>>(8*i)))
		}
	}
	if intg%9 > 0 {
		put(intg % 9)
	}
	for range intg / 9 {
		put(9)
	}
	for range scale / 9 {
		put(9)
	}
	if scale%9 > 0 {
		put(scale % 9)
	}
	if neg {
		for i := range out {
			out[i] ^= 0xff
		}
	}
	out[0] ^= 0x80
	return out
}

func be(v uint64, n int) []byte {
	b := make([]byte, n)
	for i := n - 1; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
	return b
}

// encFrac appends the fractional part of a packed temporal value as the
// server does (my_*_packed_to_binary): frac is the signed remainder.
func encFrac(b []byte, frac int64, fsp int) []byte {
	switch (fsp + 1) / 2 {
	case 1:
		return append(b, byte(int8(frac/10000)))
	case 2:
		return append(b, be(uint64(uint16(int16(frac/100))), 2)...)
	case 3:
		return append(b, be(uint64(frac)&0xffffff, 3)...)
	}
	return b
}

// encDateTime2 encodes a DATETIME(fsp) as the server does.
func encDateTime2(y, mo, d, h, mi, s, usec int64, fsp int) []byte {
	ymd := (y*13+mo)<<5 | d
	hms := h<<12 | mi<<6 | s
	packed := (ymd<<17|hms)<<24 + usec
	b := be(uint64(packed>>24+0x8000000000), 5)
	return encFrac(b, packed%(1<<24), fsp)
}

// encTime2 encodes a TIME(fsp) as the server does.
func encTime2(neg bool, h, mi, s, usec int64, fsp int) []byte {
	nr := (h<<12|mi<<6|s)<<24 + usec
	if neg {
		nr = -nr
	}
	if fsp >= 5 {
		return be(uint64(nr+0x800000000000), 6)
	}
	b := be(uint64(nr>>24+0x800000), 3)
	return encFrac(b, nr%(1<<24), fsp)
}

func le(v uint64, n int) []byte {
	b := make([]byte, n)
	for i := range n {
		b[i] = byte(v >> (8 * i))
	}
	return b
}

// decodeOne decodes value as the only column c of a one-row insert.
func decodeOne(t *testing.T, c col, value []byte) (any, error) {
	t.Helper()
	p := newParser(t, false)
	parseAll(t, p, event(TableMapEventType, 1, 0, tableMapBody(1, "db", "t", []col{c}, true), false))
	ev, err := p.Parse(event(WriteRowsV1EventType, 2, 0, rowsBody(1, 1, false, append([]byte{0}, value...)), false))
	if err != nil {
		t.Fatalf("parse rows: %v", err)
	}
	rows, err := ev.(*RowsEvent).Rows()
	if err != nil {
		return nil, err
	}
	if len(rows) != 1 || len(rows[0]) != 1 {
		t.Fatalf("got %d rows: %v", len(rows), rows)
	}
	return rows[0][0], nil
}

func utc(y int, mo time.Month, d, h, mi, s, usec int) time.Time {
	return time.Date(y, mo, d, h, mi, s, usec*1000, time.UTC)
}

func TestColumnTypes(t *testing.T) {
	var (
		tiny      = col{typ: TypeTiny}
		utiny     = col{typ: TypeTiny, unsigned: true}
		short     = col{typ: TypeShort}
		ushort    = col{typ: TypeShort, unsigned: true}
		int24     = col{typ: TypeInt24}
		uint24    = col{typ: TypeInt24, unsigned: true}
		long      = col{typ: TypeLong}
		ulong     = col{typ: TypeLong, unsigned: true}
		longlong  = col{typ: TypeLongLong}
		ulonglong = col{typ: TypeLongLong, unsigned: true}
	)
	dec := func(p, s byte) col { return col{typ: TypeNewDecimal, meta: []byte{p, s}} }
	dt2 := func(fsp byte) col { return col{typ: TypeDateTime2, meta: []byte{fsp}} }
	ts2 := func(fsp byte) col { return col{typ: TypeTimestamp2, meta: []byte{fsp}} }
	tm2 := func(fsp byte) col { return col{typ: TypeTime2, meta: []byte{fsp}} }
	varchar := func(max int) col { return col{typ: TypeVarchar, meta: le(uint64(max), 2)} }
	blob := func(n byte) col { return col{typ: TypeBlob, meta: []byte{n}} }
	long300 := strings.Repeat("é", 150) // 300 bytes
	cases := []struct {
		name  string
		c     col
		value []byte
		want  any
	}{
		{"tiny -1", tiny, []byte{0xff}, int64(-1)},
		{"tiny 127", tiny, []byte{0x7f}, int64(127)},
		{"tiny unsigned 255", utiny, []byte{0xff}, uint64(255)},
		{"short min", short, le(0x8000, 2), int64(math.MinInt16)},
		{"short unsigned max", ushort, le(0xffff, 2), uint64(math.MaxUint16)},
		{"int24 -1", int24, le(0xffffff, 3), int64(-1)},
		{"int24 max", int24, le(0x7fffff, 3), int64(8388607)},
		{"int24 min", int24, le(0x800000, 3), int64(-8388608)},
		{"int24 unsigned max", uint24, le(0xffffff, 3), uint64(16777215)},
		{"long min", long, le(0x80000000, 4), int64(math.MinInt32)},
		{"long unsigned max", ulong, le(0xffffffff, 4), uint64(math.MaxUint32)},
		{"longlong min", longlong, le(1<<63, 8), int64(math.MinInt64)},
		{"longlong 42", longlong, le(42, 8), int64(42)},
		{"longlong unsigned max", ulonglong, le(math.MaxUint64, 8), uint64(math.MaxUint64)},
		{"year 2024", col{typ: TypeYear}, []byte{124}, int64(2024)},
		{"year 0", col{typ: TypeYear}, []byte{0}, int64(0)},
		{"float", col{typ: TypeFloat, meta: []byte{4}}, le(uint64(math.Float32bits(1.5)), 4), 1.5},
		{"double", col{typ: TypeDouble, meta: []byte{8}}, le(math.Float64bits(-2.25), 8), -2.25},
		// DECIMAL: hand-computed bytes, then the encoder.
		{"decimal(10,2) hand", dec(10, 2), []byte{0x80, 0x12, 0xd6, 0x87, 0x59}, "1234567.89"},
		{"decimal(10,2) negative hand", dec(10, 2), []byte{0x7f, 0xed, 0x29, 0x78, 0xa6}, "-1234567.89"},
		{"decimal(10,2) 0", dec(10, 2), encDecimal("0.00", 10, 2), "0.00"},
		{"decimal(10,2) -0.05", dec(10, 2), encDecimal("-0.05", 10, 2), "-0.05"},
		{"decimal(5,0)", dec(5, 0), encDecimal("-99999", 5, 0), "-99999"},
		{"decimal(4,4)", dec(4, 4), encDecimal("0.5", 4, 4), "0.5000"},
		{"decimal(65,30) max", dec(65, 30), encDecimal(strings.Repeat("9", 35)+"."+strings.Repeat("9", 30), 65, 30), strings.Repeat("9", 35) + "." + strings.Repeat("9", 30)},
		{"decimal(65,30) negative", dec(65, 30), encDecimal("-123456789012345678.000000000000000000000000000001", 65, 30), "-123456789012345678.000000000000000000000000000001"},
		{"decimal(18,9)", dec(18, 9), encDecimal("123456789.123456789", 18, 9), "123456789.123456789"},
		{"decimal(19,1)", dec(19, 1), encDecimal("-100000000000000000.1", 19, 1), "-100000000000000000.1"},
		{"date", col{typ: TypeDate}, le(2024<<9|2<<5|29, 3), "2024-02-29"},
		{"date zero", col{typ: TypeDate}, le(0, 3), "0000-00-00"},
		{"time2(0)", tm2(0), []byte{0x80, 0xa2, 0xcc}, "10:11:12"},
		{"time2(0) negative", tm2(0), []byte{0x7f, 0x5d, 0x34}, "-10:11:12"},
		{"time2(0) max", tm2(0), encTime2(false, 838, 59, 59, 0, 0), "838:59:59"},
		{"time2(0) min", tm2(0), encTime2(true, 838, 59, 59, 0, 0), "-838:59:59"},
		{"time2(1) negative", tm2(1), encTime2(true, 0, 0, 1, 500000, 1), "-00:00:01.5"},
		{"time2(3)", tm2(3), encTime2(false, 23, 59, 59, 999000, 3), "23:59:59.999"},
		{"time2(3) negative", tm2(3), encTime2(true, 0, 0, 1, 500000, 3), "-00:00:01.500"},
		{"time2(3) negative whole", tm2(3), encTime2(true, 1, 0, 0, 0, 3), "-01:00:00.000"},
		{"time2(6)", tm2(6), encTime2(false, 1, 2, 3, 4, 6), "01:02:03.000004"},
		{"time2(6) negative", tm2(6), encTime2(true, 12, 0, 0, 999999, 6), "-12:00:00.999999"},
		{"datetime2(0)", dt2(0), encDateTime2(2024, 1, 2, 3, 4, 5, 0, 0), utc(2024, 1, 2, 3, 4, 5, 0)},
		{"datetime2(0) min", dt2(0), encDateTime2(1000, 1, 1, 0, 0, 0, 0, 0), utc(1000, 1, 1, 0, 0, 0, 0)},
		{"datetime2(0) year 1", dt2(0), encDateTime2(1, 1, 1, 0, 0, 0, 0, 0), utc(1, 1, 1, 0, 0, 0, 0)},
		{"datetime2(0) zero", dt2(0), encDateTime2(0, 0, 0, 0, 0, 0, 0, 0), time.Time{}},
		{"datetime2(1)", dt2(1), encDateTime2(2024, 6, 30, 12, 0, 0, 900000, 1), utc(2024, 6, 30, 12, 0, 0, 900000)},
		{"datetime2(3)", dt2(3), encDateTime2(2000, 2, 29, 23, 59, 59, 123000, 3), utc(2000, 2, 29, 23, 59, 59, 123000)},
		{"datetime2(6) max", dt2(6), encDateTime2(9999, 12, 31, 23, 59, 59, 999999, 6), utc(9999, 12, 31, 23, 59, 59, 999999)},
		{"datetime2(6) small fraction", dt2(6), encDateTime2(2024, 1, 1, 0, 0, 0, 1, 6), utc(2024, 1, 1, 0, 0, 0, 1)},
		{"timestamp2(0)", ts2(0), be(1700000000, 4), time.Unix(1700000000, 0).UTC()},
		{"timestamp2(0) zero", ts2(0), be(0, 4), time.Time{}},
		{"timestamp2(3)", ts2(3), append(be(1700000000, 4), be(1234, 2)...), time.Unix(1700000000, 123400000).UTC()},
		{"timestamp2(6)", ts2(6), append(be(2147483647, 4), be(999999, 3)...), time.Unix(2147483647, 999999000).UTC()},
		{"varchar 1-byte length", varchar(100), append([]byte{3}, "abc"...), []byte("abc")},
		{"varchar 255 is 1 byte", varchar(255), append([]byte{2}, "hi"...), []byte("hi")},
		{"varchar 2-byte length", varchar(1020), append(le(300, 2), long300...), []byte(long300)},
		{"varchar empty", varchar(1020), le(0, 2), []byte{}},
		{"char(10)", col{typ: TypeString, meta: []byte{TypeString, 10}}, append([]byte{2}, "ab"...), []byte("ab")},
		{"char(255) utf8mb4", col{typ: TypeString, meta: []byte{0xce, 0xfc}}, append(le(300, 2), long300...), []byte(long300)},
		{"binary(16)", col{typ: TypeString, meta: []byte{TypeString, 16}}, append([]byte{16}, make([]byte, 16)...), make([]byte, 16)},
		{"enum 1 byte", col{typ: TypeString, meta: []byte{TypeEnum, 1}, values: []string{"a", "b"}}, []byte{2}, int64(2)},
		{"enum 2 bytes", col{typ: TypeString, meta: []byte{TypeEnum, 2}}, le(300, 2), int64(300)},
		{"set 1 byte", col{typ: TypeString, meta: []byte{TypeSet, 1}, values: []string{"x", "y", "z"}}, []byte{5}, uint64(5)},
		{"set 8 bytes", col{typ: TypeString, meta: []byte{TypeSet, 8}}, le(1<<63|1, 8), uint64(1<<63 | 1)},
		{"tinyblob", blob(1), append([]byte{3}, "xyz"...), []byte("xyz")},
		{"blob", blob(2), append(le(3, 2), "xyz"...), []byte("xyz")},
		{"mediumblob", blob(3), append(le(3, 3), "xyz"...), []byte("xyz")},
		{"longblob (and MariaDB JSON)", blob(4), append(le(9, 4), `{"a": 1}`+" "...), []byte(`{"a": 1} `)},
		{"geometry", col{typ: TypeGeometry, meta: []byte{4}}, append(le(2, 4), 1, 2), []byte{1, 2}},
		{"bit(1)", col{typ: TypeBit, meta: []byte{1, 0}}, []byte{1}, uint64(1)},
		{"bit(10)", col{typ: TypeBit, meta: []byte{2, 1}}, []byte{0x03, 0xff}, uint64(0x3ff)},
		{"bit(64)", col{typ: TypeBit, meta: []byte{0, 8}}, be(math.MaxUint64, 8), uint64(math.MaxUint64)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeOne(t, tc.c, tc.value)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v (%T), want %#v (%T)", got, got, tc.want, tc.want)
			}
		})
	}
}

func TestColumnErrors(t *testing.T) {
	cases := []struct {
		name  string
		c     col
		value []byte
		want  error
		text  string
	}{
		{"mysql json truncated", col{typ: TypeJSON, meta: []byte{4}, name: "doc"}, append(le(1, 4), 0), ErrMalformed, "JSON: truncated object or array header"},
		{"old datetime", col{typ: TypeDateTime, name: "at"}, le(0, 8), ErrUnsupported, "column at of db.t"},
		{"old timestamp", col{typ: TypeTimestamp}, le(0, 4), ErrUnsupported, "column #0 of db.t"},
		{"old decimal", col{typ: TypeDecimal}, nil, ErrUnsupported, "DECIMAL"},
		{"compressed varchar", col{typ: TypeVarcharCompressed, meta: le(10, 2)}, []byte{0}, ErrUnsupported, "VARCHAR_COMPRESSED"},
		{"negative datetime", col{typ: TypeDateTime2, meta: []byte{0}}, []byte{0x7f, 0xff, 0xff, 0xff, 0xff}, ErrMalformed, "negative"},
		{"month 13", col{typ: TypeDateTime2, meta: []byte{0}}, encDateTime2(2024, 13, 1, 0, 0, 0, 0, 0), ErrMalformed, "not a valid time"},
		{"zero day", col{typ: TypeDateTime2, meta: []byte{0}}, encDateTime2(2024, 1, 0, 0, 0, 0, 0, 0), ErrMalformed, "not a valid time"},
		{"february 30", col{typ: TypeDateTime2, meta: []byte{0}}, encDateTime2(2023, 2, 29, 0, 0, 0, 0, 0), ErrMalformed, "not a valid date"},
		{"hour 24", col{typ: TypeDateTime2, meta: []byte{0}}, encDateTime2(2023, 2, 1, 24, 0, 0, 0, 0), ErrMalformed, ""},
		{"fsp 7", col{typ: TypeDateTime2, meta: []byte{7}}, make([]byte, 9), ErrMalformed, "precision 7"},
		{"timestamp fraction", col{typ: TypeTimestamp2, meta: []byte{6}}, append(be(1, 4), be(1000000, 3)...), ErrMalformed, ""},
		{"time minute 60", col{typ: TypeTime2, meta: []byte{0}}, be(0x800000+60<<6, 3), ErrMalformed, ""},
		{"decimal digits", col{typ: TypeNewDecimal, meta: []byte{9, 0}}, be(0x80000000|1000000000, 4), ErrMalformed, "out of range"},
		{"decimal precision", col{typ: TypeNewDecimal, meta: []byte{70, 0}}, make([]byte, 40), ErrMalformed, "DECIMAL(70,0)"},
		{"blob size 5", col{typ: TypeBlob, meta: []byte{5}}, make([]byte, 5), ErrMalformed, ""},
		{"blob longer than event", col{typ: TypeBlob, meta: []byte{4}}, append(le(1<<31, 4), 1), ErrMalformed, ""},
		{"varchar longer than event", col{typ: TypeVarchar, meta: le(1000, 2)}, append(le(900, 2), 1), ErrMalformed, ""},
		{"bit(65)", col{typ: TypeBit, meta: []byte{1, 8}}, make([]byte, 9), ErrMalformed, ""},
		{"enum 3 bytes", col{typ: TypeString, meta: []byte{TypeEnum, 3}}, make([]byte, 3), ErrMalformed, ""},
		{"string real type", col{typ: TypeString, meta: []byte{TypeBlob, 3}}, make([]byte, 3), ErrUnsupported, ""},
		{"truncated int", col{typ: TypeLongLong}, make([]byte, 7), ErrMalformed, ""},
		{"truncated decimal", col{typ: TypeNewDecimal, meta: []byte{10, 2}}, make([]byte, 4), ErrMalformed, ""},
		{"truncated time2(6)", col{typ: TypeTime2, meta: []byte{6}}, make([]byte, 5), ErrMalformed, ""},
		{"truncated datetime2(3)", col{typ: TypeDateTime2, meta: []byte{3}}, make([]byte, 6), ErrMalformed, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeOne(t, tc.c, tc.value)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("got %v, %v; want an error wrapping %v containing %q", got, err, tc.want, tc.text)
			}
		})
	}
}

// allColumns is a table with a column of every supported type.
func allColumns() []col {
	return []col{
		{typ: TypeLongLong, name: "id", unsigned: true},
		{typ: TypeTiny, nullable: true, name: "ti"},
		{typ: TypeVarchar, meta: le(1020, 2), nullable: true, name: "vc"},
		{typ: TypeBlob, meta: []byte{2}, nullable: true, name: "b"},
		{typ: TypeNewDecimal, meta: []byte{10, 2}, nullable: true, name: "d"},
		{typ: TypeDateTime2, meta: []byte{6}, nullable: true, name: "dt"},
		{typ: TypeTimestamp2, meta: []byte{3}, nullable: true, name: "ts"},
		{typ: TypeTime2, meta: []byte{0}, nullable: true, name: "tm"},
		{typ: TypeDate, nullable: true, name: "da"},
		{typ: TypeString, meta: []byte{TypeEnum, 1}, nullable: true, name: "e", values: []string{"on", "off"}},
		{typ: TypeString, meta: []byte{TypeSet, 1}, nullable: true, name: "s", values: []string{"a", "b"}},
		{typ: TypeBit, meta: []byte{3, 0}, nullable: true, name: "bi"},
		{typ: TypeDouble, meta: []byte{8}, nullable: true, name: "f"},
		{typ: TypeString, meta: []byte{TypeString, 36}, name: "c"},
		{typ: TypeYear, nullable: true, name: "y"},
	}
}

func TestTableMap(t *testing.T) {
	cols := allColumns()
	p := newParser(t, true)
	ev := parseAll(t, p, event(TableMapEventType, 10, 0, tableMapBody(0x123456789a, "shop", "orders", cols, true, 0, 13), true))[0].(*TableMapEvent)
	if ev.TableID != 0x123456789a || ev.Schema != "shop" || ev.Table != "orders" || !reflect.DeepEqual(ev.PrimaryKey, []int{0, 13}) {
		t.Errorf("got %+v", ev)
	}
	if len(ev.Columns) != len(cols) {
		t.Fatalf("%d columns", len(ev.Columns))
	}
	for i, c := range cols {
		got := ev.Columns[i]
		if got.Type != c.typ || got.Name != c.name || got.Nullable != c.nullable || got.Unsigned != c.unsigned {
			t.Errorf("column %d: got %+v, want %+v", i, got, c)
		}
	}
	if m := ev.Columns[2].Meta; m != 1020 {
		t.Errorf("varchar meta %d", m)
	}
	if m := ev.Columns[4].Meta; m != 10<<8|2 {
		t.Errorf("decimal meta %#x", m)
	}
	if e := ev.Columns[9]; e.RealType() != TypeEnum || !reflect.DeepEqual(e.EnumValues, []string{"on", "off"}) {
		t.Errorf("enum: %+v", e)
	}
	if s := ev.Columns[10]; s.RealType() != TypeSet || !reflect.DeepEqual(s.SetValues, []string{"a", "b"}) {
		t.Errorf("set: %+v", s)
	}
	if p.Table(0x123456789a) != ev {
		t.Error("table map not kept")
	}

	// Without optional metadata: no names, everything signed.
	ev = parseAll(t, p, event(TableMapEventType, 10, 0, tableMapBody(7, "shop", "orders", cols, false), true))[0].(*TableMapEvent)
	if ev.Columns[0].Name != "" || ev.Columns[0].Unsigned || ev.PrimaryKey != nil {
		t.Errorf("without optional metadata: %+v", ev.Columns[0])
	}

	// A type without known metadata: refused, not misparsed.
	bad := tableMapBody(8, "db", "t", []col{{typ: 100}}, false)
	if _, err := p.Parse(event(TableMapEventType, 10, 0, bad, true)); !errors.Is(err, ErrUnsupported) {
		t.Errorf("unknown type: %v", err)
	}
	// Metadata left over.
	bad = tableMapBody(8, "db", "t", []col{{typ: TypeLong, meta: []byte{1}}}, false)
	if _, err := p.Parse(event(TableMapEventType, 10, 0, bad, true)); !errors.Is(err, ErrMalformed) {
		t.Errorf("extra metadata: %v", err)
	}

	// Table maps end with the format description (a new binlog file).
	parseAll(t, p, fde(true))
	if p.Table(0x123456789a) != nil {
		t.Error("table map kept across a format description")
	}
}

// row encodes a row image: the null bitmap of n present columns, then the
// values of the columns not NULL.
func row(n int, nulls []int, values ...[]byte) []byte {
	b := make([]byte, (n+7)/8)
	for _, i := range nulls {
		b[i/8] |= 1 << (i % 8)
	}
	for _, v := range values {
		b = append(b, v...)
	}
	return b
}

func TestRows(t *testing.T) {
	cols := allColumns()
	n := len(cols)
	p := newParser(t, true)
	parseAll(t, p, event(TableMapEventType, 10, 0, tableMapBody(5, "shop", "orders", cols, true), true))

	full := func(id uint64) []byte {
		return row(n, nil,
			le(id, 8), []byte{0xfe}, append([]byte{3, 0}, "hé"...), append(le(1, 2), 'x'),
			encDecimal("-3.50", 10, 2), encDateTime2(2024, 5, 6, 7, 8, 9, 123456, 6),
			append(be(1700000000, 4), be(500, 2)...), encTime2(false, 1, 2, 3, 0, 0),
			le(2024<<9|5<<5|6, 3), []byte{1}, []byte{3}, []byte{5}, le(math.Float64bits(0.25), 8),
			append([]byte{3}, "abc"...), []byte{124})
	}
	wantFull := func(id uint64) []any {
		return []any{uint64(id), int64(-2), []byte("hé"), []byte("x"), "-3.50", utc(2024, 5, 6, 7, 8, 9, 123456),
			time.Unix(1700000000, 50000000).UTC(), "01:02:03", "2024-05-06", int64(1), uint64(3), uint64(5), 0.25, []byte("abc"), int64(2024)}
	}
	nullable := []int{}
	for i, c := range cols {
		if c.nullable {
			nullable = append(nullable, i)
		}
	}
	nulls := row(n, nullable, le(2, 8), append([]byte{1}, "c"...))
	wantNulls := make([]any, n)
	wantNulls[0], wantNulls[13] = uint64(2), []byte("c")

	// A multi-row insert, one row all NULL but the NOT NULL columns.
	ev := parseAll(t, p, event(WriteRowsV1EventType, 20, 0, rowsBody(5, n, false, full(1), nulls, full(3)), true))[0].(*RowsEvent)
	if ev.Kind != Insert || ev.TableID != 5 || ev.Table.Table != "orders" || ev.Partial || ev.RowsFlags != 1 {
		t.Errorf("event: %+v", ev)
	}
	rows, err := ev.Rows()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]any{wantFull(1), wantNulls, wantFull(3)}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("rows:\n got %v\nwant %v", rows, want)
	}

	// An update: before and after images.
	ev = parseAll(t, p, event(UpdateRowsV1EventType, 20, 0, rowsBody(5, n, true, full(1), nulls, full(3), full(4)), true))[0].(*RowsEvent)
	before, after, err := ev.Images()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, [][]any{wantFull(1), wantFull(3)}) || !reflect.DeepEqual(after, [][]any{wantNulls, wantFull(4)}) {
		t.Errorf("update:\nbefore %v\n after %v", before, after)
	}
	if rows, _ := ev.Rows(); !reflect.DeepEqual(rows, after) {
		t.Errorf("Rows of an update: %v, want the after images", rows)
	}
	// An update with an odd number of images: the last after image is missing.
	ev = parseAll(t, p, event(UpdateRowsV1EventType, 20, 0, rowsBody(5, n, true, full(1)), true))[0].(*RowsEvent)
	if _, err := ev.Rows(); !errors.Is(err, ErrMalformed) {
		t.Errorf("update without its after image: %v", err)
	}

	// A delete, in the v2 format (extra data skipped).
	v2 := rowsBody(5, n, false, full(9))
	v2 = append(v2[:8:8], append([]byte{4, 0, 0xaa, 0xbb}, v2[8:]...)...)
	ev = parseAll(t, p, event(DeleteRowsV2EventType, 20, 0, v2, true))[0].(*RowsEvent)
	before, after, err = ev.Images()
	if err != nil || ev.Kind != Delete || after != nil || !reflect.DeepEqual(before, [][]any{wantFull(9)}) {
		t.Errorf("delete: %v %v %v", before, after, err)
	}
	if rows, _ := ev.Rows(); !reflect.DeepEqual(rows, before) {
		t.Errorf("Rows of a delete: %v, want the before images", rows)
	}

	// A partial image (binlog_row_image=MINIMAL): the id only.
	partial := rowsBody(5, n, false)
	partial = append(partial[:len(partial)-2], 1, 0) // bitmap: column 0
	partial = append(partial, row(1, nil, le(7, 8))...)
	ev = parseAll(t, p, event(DeleteRowsV1EventType, 20, 0, partial, true))[0].(*RowsEvent)
	rows, err = ev.Rows()
	if err != nil || !ev.Partial || len(rows) != 1 || rows[0][0] != uint64(7) || rows[0][1] != nil {
		t.Errorf("partial: %v %v partial=%v", rows, err, ev.Partial)
	}

	// Trailing bytes that are not a whole row.
	ev = parseAll(t, p, event(WriteRowsV1EventType, 20, 0, append(rowsBody(5, n, false, full(1)), 0, 0), true))[0].(*RowsEvent)
	if _, err := ev.Rows(); !errors.Is(err, ErrMalformed) {
		t.Errorf("trailing bytes: %v", err)
	}

	// Every truncation of the rows is an error.
	body := rowsBody(5, n, false, full(1))
	for cut := len(body) - 1; cut >= 0; cut-- {
		ev, err := p.Parse(event(WriteRowsV1EventType, 20, 0, body[:cut], true))
		if err != nil {
			continue
		}
		if rows, err := ev.(*RowsEvent).Rows(); err == nil && len(rows) > 0 {
			t.Errorf("cut at %d: %v", cut, rows)
		}
	}
}

func TestRowsTableMap(t *testing.T) {
	p := newParser(t, true)
	body := rowsBody(5, 1, false, row(1, nil, []byte{1}))
	if _, err := p.Parse(event(WriteRowsV1EventType, 20, 0, body, true)); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "no table map") {
		t.Errorf("no table map: %v", err)
	}
	parseAll(t, p, event(TableMapEventType, 10, 0, tableMapBody(5, "db", "t", []col{{typ: TypeTiny}, {typ: TypeTiny}}, true), true))
	if _, err := p.Parse(event(WriteRowsV1EventType, 20, 0, body, true)); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "columns") {
		t.Errorf("column count: %v", err)
	}
	// A rotate drops the table maps.
	parseAll(t, p, event(RotateEventType, 0, 0, append(le(4, 8), "bin.2"...), true))
	if p.Table(5) != nil {
		t.Error("table map kept across a rotate")
	}
}

// A wide table whose images carry one column: the allocation is bounded.
func TestRowsSparseBudget(t *testing.T) {
	p := newParser(t, false)
	cols := make([]col, 5000)
	for i := range cols {
		cols[i] = col{typ: TypeTiny, nullable: true}
	}
	parseAll(t, p, event(TableMapEventType, 10, 0, tableMapBody(5, "db", "t", cols, false), false))
	body := rowsBody(5, len(cols), false)
	bitmapStart := len(body) - (len(cols)+7)/8
	for i := bitmapStart; i < len(body); i++ {
		body[i] = 0
	}
	body[bitmapStart] = 1
	body = append(body, make([]byte, 2<<20)...) // a million rows of one present column
	ev := parseAll(t, p, event(WriteRowsV1EventType, 20, 0, body, false))[0].(*RowsEvent)
	if _, err := ev.Rows(); !errors.Is(err, ErrMalformed) {
		t.Errorf("sparse rows: %v", err)
	}
}
