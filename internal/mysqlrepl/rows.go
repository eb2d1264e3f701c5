package mysqlrepl

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"
)

// RowsKind says what a RowsEvent did.
type RowsKind uint8

// The kinds of rows events.
const (
	Insert RowsKind = iota + 1 // WRITE_ROWS: the rows inserted
	Update                     // UPDATE_ROWS: each row before and after
	Delete                     // DELETE_ROWS: the rows deleted
)

// String returns "insert", "update" or "delete".
func (k RowsKind) String() string {
	switch k {
	case Insert:
		return "insert"
	case Update:
		return "update"
	case Delete:
		return "delete"
	}
	return fmt.Sprintf("RowsKind(%d)", uint8(k))
}

// RowsEvent (WRITE_ROWS, UPDATE_ROWS, DELETE_ROWS, v1 as MariaDB writes
// them, or v2) holds the row images of one statement on one table. Its rows
// are decoded on demand by Rows or Images.
type RowsEvent struct {
	Header
	// Kind is Insert, Update or Delete.
	Kind RowsKind
	// TableID is the table map's id.
	TableID uint64
	// Table is the table map in force for TableID when the event was read.
	Table *TableMapEvent
	// RowsFlags are the event's flags (0x1: the statement's last rows
	// event).
	RowsFlags uint16
	// Partial reports that the row images leave out columns
	// (binlog_row_image MINIMAL or NOBLOB): those columns read as nil,
	// like NULL. It is false with binlog_row_image=FULL.
	Partial bool

	present, presentAfter []byte // column bitmaps of the before (or only) and after images
	rows                  []byte // the row images
}

// Rows decodes the event's rows: the inserted rows of an Insert, the
// deleted rows of a Delete, the rows after the change of an Update (use
// Images for both). Each row has one value per column of Table, in order:
//
//   - nil for NULL (and for a column the image leaves out: see Partial);
//   - int64 for signed TINYINT, SMALLINT, MEDIUMINT, INT, BIGINT and for
//     YEAR (0 or 1901..2155), uint64 for the unsigned ones (Column.Unsigned,
//     from the table map's optional metadata);
//   - float64 for FLOAT and DOUBLE;
//   - string for DECIMAL, as SELECT prints it ("-12.50": the column's
//     scale, exact); for DATE ("2006-01-02"); for TIME ("-838:59:59",
//     "15:04:05.123" with the column's fractional digits, as SELECT prints
//     it);
//   - time.Time in UTC for DATETIME (the wall clock, read as UTC) and
//     TIMESTAMP (the instant), to the microsecond; the zero time.Time for
//     the zero value '0000-00-00 00:00:00' of either, and an error for
//     other dates with a zero part;
//   - []byte for CHAR, VARCHAR, BINARY, VARBINARY, TEXT, BLOB, GEOMETRY
//     and MariaDB's JSON (a LONGTEXT: the JSON text); []byte of JSON text
//     for MySQL's JSON, decoded from its binary form (DecodeJSON);
//   - int64 for ENUM: the 1-based index of the value (0 for ”),
//     Column.EnumValues names them; uint64 for SET: the bitmap of its
//     members, Column.SetValues names them; uint64 for BIT.
//
// Pre-5.6 temporal types and MariaDB compressed columns
// are refused with an error wrapping ErrUnsupported that names the column;
// malformed images return an error wrapping ErrMalformed. It never panics.
// []byte values refer to the event's bytes: copy them to keep them beyond
// the event.
func (e *RowsEvent) Rows() ([][]any, error) {
	before, after, err := e.Images()
	if e.Kind == Delete {
		return before, err
	}
	return after, err
}

// Images decodes the event's rows as Rows does and returns them by image:
// an Insert has only after images, a Delete only before images, an Update
// both, before[i] becoming after[i].
func (e *RowsEvent) Images() (before, after [][]any, err error) {
	t := e.Table
	if t == nil {
		return nil, nil, malformed("rows event of table id %d without its table map", e.TableID)
	}
	n := len(t.Columns)
	if len(e.present)*8 < n || (e.Kind == Update && len(e.presentAfter)*8 < n) {
		return nil, nil, malformed("rows event of %s.%s: column bitmap shorter than its %d columns", t.Schema, t.Table, n)
	}
	// Bound what sparse images (few present columns in a wide table) may
	// allocate: a full image costs at least a bit per column.
	budget := 1<<20 + 8*len(e.rows)
	r := newReader(e.rows)
	for len(r.b) > 0 {
		img := e.present
		for i := 0; i < 2; i++ {
			budget -= n
			if budget < 0 {
				return nil, nil, malformed("rows event of %s.%s: too many rows for its size", t.Schema, t.Table)
			}
			row, err := decodeRow(r, t, img)
			if err != nil {
				return nil, nil, err
			}
			switch {
			case e.Kind == Delete || e.Kind == Update && i == 0:
				before = append(before, row)
			default:
				after = append(after, row)
			}
			if e.Kind != Update {
				break
			}
			img = e.presentAfter
		}
	}
	return before, after, nil
}

func popcount(b []byte, n int) int {
	c := 0
	for i := 0; i < n; i++ {
		if b[i/8]&(1<<(i%8)) != 0 {
			c++
		}
	}
	return c
}

func decodeRow(r *reader, t *TableMapEvent, present []byte) ([]any, error) {
	n := len(t.Columns)
	np := popcount(present, n)
	if np == 0 {
		return nil, malformed("rows event of %s.%s: row image with no column", t.Schema, t.Table)
	}
	nulls := r.bytes((np+7)/8, "null bitmap")
	if err := r.err("rows event"); err != nil {
		return nil, err
	}
	row := make([]any, n)
	k := 0 // index among present columns
	for i := range t.Columns {
		if present[i/8]&(1<<(i%8)) == 0 {
			continue
		}
		null := nulls[k/8]&(1<<(k%8)) != 0
		k++
		if null {
			continue
		}
		v, err := decodeValue(r, &t.Columns[i])
		if err == nil {
			err = r.err("value")
		}
		if err != nil {
			name := t.Columns[i].Name
			if name == "" {
				name = fmt.Sprintf("#%d", i)
			}
			return nil, fmt.Errorf("column %s of %s.%s: %w", name, t.Schema, t.Table, err)
		}
		row[i] = v
	}
	return row, nil
}

func decodeValue(r *reader, c *Column) (any, error) {
	switch c.Type {
	case TypeTiny:
		return integer(r.uN(1, "TINYINT"), 8, c.Unsigned), nil
	case TypeShort:
		return integer(r.uN(2, "SMALLINT"), 16, c.Unsigned), nil
	case TypeInt24:
		return integer(r.uN(3, "MEDIUMINT"), 24, c.Unsigned), nil
	case TypeLong:
		return integer(r.uN(4, "INT"), 32, c.Unsigned), nil
	case TypeLongLong:
		return integer(r.uN(8, "BIGINT"), 64, c.Unsigned), nil
	case TypeYear:
		y := int64(r.u8("YEAR"))
		if y != 0 {
			y += 1900
		}
		return y, nil
	case TypeFloat:
		return float64(math.Float32frombits(r.u32("FLOAT"))), nil
	case TypeDouble:
		return math.Float64frombits(r.u64("DOUBLE")), nil
	case TypeNewDecimal:
		return decodeDecimal(r, int(c.Meta>>8), int(c.Meta&0xff))
	case TypeDate:
		v := r.uN(3, "DATE")
		return fmt.Sprintf("%04d-%02d-%02d", v>>9, v>>5&15, v&31), nil
	case TypeTime2:
		return decodeTime2(r, int(c.Meta))
	case TypeDateTime2:
		return decodeDateTime2(r, int(c.Meta))
	case TypeTimestamp2:
		return decodeTimestamp2(r, int(c.Meta))
	case TypeVarchar, TypeVarString:
		size := 1
		if c.Meta > 255 {
			size = 2
		}
		return r.bytes(int(r.uN(size, "length")), "string"), nil
	case TypeBlob, TypeTinyBlob, TypeMediumBlob, TypeLongBlob, TypeGeometry:
		if c.Meta < 1 || c.Meta > 4 {
			return nil, malformed("BLOB length size %d", c.Meta)
		}
		l := r.uN(int(c.Meta), "length")
		if l > uint64(len(r.b)) {
			return nil, malformed("BLOB of %d bytes, %d left", l, len(r.b))
		}
		return r.bytes(int(l), "blob"), nil
	case TypeString, TypeEnum, TypeSet:
		t, l := c.stringType()
		switch t {
		case TypeEnum:
			if l != 1 && l != 2 {
				return nil, malformed("ENUM of %d bytes", l)
			}
			return int64(r.uN(l, "ENUM")), nil
		case TypeSet:
			if l < 1 || l > 8 {
				return nil, malformed("SET of %d bytes", l)
			}
			return r.uN(l, "SET"), nil
		case TypeString:
			size := 1
			if l > 255 {
				size = 2
			}
			return r.bytes(int(r.uN(size, "length")), "string"), nil
		}
		return nil, unsupported("%s with real type %s", typeName(c.Type), typeName(t))
	case TypeBit:
		nbits := int(c.Meta>>8)*8 + int(c.Meta&0xff)
		if nbits > 64 {
			return nil, malformed("BIT(%d)", nbits)
		}
		return beUint(r.bytes((nbits+7)/8, "BIT")), nil
	case TypeNull:
		return nil, nil
	case TypeJSON:
		if c.Meta < 1 || c.Meta > 4 {
			return nil, malformed("JSON length size %d", c.Meta)
		}
		l := r.uN(int(c.Meta), "length")
		if l > uint64(len(r.b)) {
			return nil, malformed("JSON of %d bytes, %d left", l, len(r.b))
		}
		return DecodeJSON(r.bytes(int(l), "JSON"))
	case TypeTimestamp, TypeDateTime, TypeTime:
		return nil, unsupported("%s: a pre-MariaDB 10.1 temporal format; rebuild the table (ALTER TABLE ... FORCE) with mysql56_temporal_format=ON", typeName(c.Type))
	}
	return nil, unsupported("%s", typeName(c.Type))
}

// integer returns v, a bits-wide little-endian integer, as uint64 when
// unsigned, else sign-extended to int64.
func integer(v uint64, nbits uint, unsigned bool) any {
	if unsigned {
		return v
	}
	return int64(v<<(64-nbits)) >> (64 - nbits)
}

var dig2bytes = [10]int{0, 1, 1, 2, 2, 3, 3, 4, 4, 4}

var pow10 = [10]uint64{1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000}

// decodeDecimal reads a DECIMAL(prec, scale) in the binary format of
// MySQL 5.0+ (decimal2bin): groups of 9 digits in 4 big-endian bytes, the
// leftover digits of each side in fewer bytes, the sign in the first bit,
// negative numbers inverted.
func decodeDecimal(r *reader, prec, scale int) (any, error) {
	if prec < 1 || prec > 65 || scale > 38 || scale > prec {
		return nil, malformed("DECIMAL(%d,%d)", prec, scale)
	}
	intg := prec - scale
	intg0, intg0x := intg/9, intg%9
	frac0, frac0x := scale/9, scale%9
	size := intg0*4 + dig2bytes[intg0x] + frac0*4 + dig2bytes[frac0x]
	raw := r.bytes(size, "DECIMAL")
	if raw == nil {
		return nil, nil // the caller reports the reader's error
	}
	b := make([]byte, size)
	copy(b, raw)
	neg := b[0]&0x80 == 0
	b[0] ^= 0x80
	if neg {
		for i := range b {
			b[i] ^= 0xff
		}
	}
	var digits strings.Builder
	group := func(n, ndigits int) error {
		v := beUint(b[:n])
		b = b[n:]
		if v >= pow10[ndigits] {
			return malformed("DECIMAL(%d,%d) digit group %d out of range", prec, scale, v)
		}
		fmt.Fprintf(&digits, "%0*d", ndigits, v)
		return nil
	}
	if intg0x > 0 {
		if err := group(dig2bytes[intg0x], intg0x); err != nil {
			return nil, err
		}
	}
	for range intg0 {
		if err := group(4, 9); err != nil {
			return nil, err
		}
	}
	for range frac0 {
		if err := group(4, 9); err != nil {
			return nil, err
		}
	}
	if frac0x > 0 {
		if err := group(dig2bytes[frac0x], frac0x); err != nil {
			return nil, err
		}
	}
	d := digits.String()
	ip, fp := strings.TrimLeft(d[:intg], "0"), d[intg:]
	if ip == "" {
		ip = "0"
	}
	s := ip
	if scale > 0 {
		s += "." + fp
	}
	if neg && strings.Trim(d, "0") != "" {
		s = "-" + s
	}
	return s, nil
}

// fraction reads the fractional seconds of a TIME2, DATETIME2 or
// TIMESTAMP2 with fsp digits, in microseconds. signed: as TIME2 and
// DATETIME2 store it (their integer part carries the sign).
func fraction(r *reader, fsp int, signed bool) int64 {
	n := (fsp + 1) / 2
	if n == 0 {
		return 0
	}
	v := r.bytes(n, "fractional seconds")
	if v == nil {
		return 0
	}
	u := beUint(v)
	var f int64
	if signed {
		f = int64(u<<(64-8*n)) >> (64 - 8*n)
	} else {
		f = int64(u)
	}
	switch n {
	case 1:
		return f * 10000
	case 2:
		return f * 100
	}
	return f
}

func checkFSP(fsp int) error {
	if fsp > 6 {
		return malformed("fractional second precision %d", fsp)
	}
	return nil
}

// decodeTime2 reads a TIME(fsp) in the format of MySQL 5.6.4+ (MariaDB
// 10.1+ with mysql56_temporal_format): 3 bytes big-endian of sign, hours,
// minutes, seconds offset by 0x800000, then the fraction.
func decodeTime2(r *reader, fsp int) (any, error) {
	if err := checkFSP(fsp); err != nil {
		return nil, err
	}
	var packed int64
	if fsp >= 5 {
		packed = int64(beUint(r.bytes(6, "TIME2"))) - 0x800000000000
	} else {
		intpart := int64(beUint(r.bytes(3, "TIME2"))) - 0x800000
		// TIME2 stores the fraction of a negative time as a complement
		// of the next second.
		n := (fsp + 1) / 2
		var frac int64
		if n > 0 {
			if v := r.bytes(n, "fractional seconds"); v != nil {
				frac = int64(beUint(v))
			}
			if intpart < 0 && frac != 0 {
				intpart++
				frac -= 1 << (8 * n)
			}
			if n == 1 {
				frac *= 10000
			} else {
				frac *= 100
			}
		}
		packed = intpart<<24 + frac
	}
	if !r.ok {
		return nil, nil
	}
	neg := packed < 0
	if neg {
		packed = -packed
	}
	hms := packed >> 24
	usec := packed % (1 << 24)
	hour, minute, second := (hms>>12)%(1<<10), (hms>>6)%(1<<6), hms%(1<<6)
	if minute > 59 || second > 59 || usec > 999999 {
		return nil, malformed("TIME2 %d:%d:%d.%d", hour, minute, second, usec)
	}
	var s strings.Builder
	if neg {
		s.WriteByte('-')
	}
	fmt.Fprintf(&s, "%02d:%02d:%02d", hour, minute, second)
	if fsp > 0 {
		fmt.Fprintf(&s, ".%0*d", fsp, usec/int64(pow10[6-fsp]))
	}
	return s.String(), nil
}

// decodeDateTime2 reads a DATETIME(fsp) in the format of MySQL 5.6.4+: 5
// bytes big-endian of sign, year*13+month, day, hour, minute, second,
// offset by 0x8000000000, then the fraction.
func decodeDateTime2(r *reader, fsp int) (any, error) {
	if err := checkFSP(fsp); err != nil {
		return nil, err
	}
	intpart := int64(beUint(r.bytes(5, "DATETIME2"))) - 0x8000000000
	frac := fraction(r, fsp, true)
	if !r.ok {
		return nil, nil
	}
	packed := intpart<<24 + frac
	if packed < 0 {
		return nil, malformed("negative DATETIME2")
	}
	usec := packed % (1 << 24)
	ymdhms := packed >> 24
	ymd, hms := ymdhms>>17, ymdhms%(1<<17)
	day, ym := ymd%(1<<5), ymd>>5
	month, year := ym%13, ym/13
	second, minute, hour := hms%(1<<6), (hms>>6)%(1<<6), hms>>12
	if packed == 0 {
		return time.Time{}, nil
	}
	return civil("DATETIME2", year, month, day, hour, minute, second, usec)
}

func civil(what string, year, month, day, hour, minute, second, usec int64) (any, error) {
	if month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 59 || usec > 999999 {
		return nil, malformed("%s %04d-%02d-%02d %02d:%02d:%02d.%06d is not a valid time", what, year, month, day, hour, minute, second, usec)
	}
	t := time.Date(int(year), time.Month(month), int(day), int(hour), int(minute), int(second), int(usec)*1000, time.UTC)
	if t.Day() != int(day) {
		return nil, malformed("%s %04d-%02d-%02d is not a valid date", what, year, month, day)
	}
	return t, nil
}

// decodeTimestamp2 reads a TIMESTAMP(fsp) in the format of MySQL 5.6.4+:
// 4 bytes big-endian of Unix seconds, then the fraction.
func decodeTimestamp2(r *reader, fsp int) (any, error) {
	if err := checkFSP(fsp); err != nil {
		return nil, err
	}
	b := r.bytes(4, "TIMESTAMP2")
	usec := fraction(r, fsp, false)
	if !r.ok {
		return nil, nil
	}
	sec := int64(binary.BigEndian.Uint32(b))
	if usec > 999999 {
		return nil, malformed("TIMESTAMP2 fraction %d", usec)
	}
	if sec == 0 && usec == 0 {
		return time.Time{}, nil
	}
	return time.Unix(sec, usec*1000).UTC(), nil
}

func (p *Parser) parseRows(h Header, body []byte) (Event, error) {
	e := &RowsEvent{Header: h}
	v2 := false
	switch h.Type {
	case WriteRowsV1EventType:
		e.Kind = Insert
	case UpdateRowsV1EventType:
		e.Kind = Update
	case DeleteRowsV1EventType:
		e.Kind = Delete
	case WriteRowsV2EventType:
		e.Kind, v2 = Insert, true
	case UpdateRowsV2EventType:
		e.Kind, v2 = Update, true
	case DeleteRowsV2EventType:
		e.Kind, v2 = Delete, true
	}
	def := 8
	if v2 {
		def = 10
	}
	part := h.Type.String()
	r := newReader(body)
	e.TableID = r.uN(p.tableIDLen(h.Type, def), "table id")
	e.RowsFlags = r.u16("flags")
	if v2 {
		extra := int(r.u16("extra data length"))
		if r.ok && extra < 2 {
			return nil, malformed("%s: extra data length %d", part, extra)
		}
		r.skip(extra-2, "extra data")
	}
	n := r.count("column count", 8*len(r.b))
	if err := r.err(part); err != nil {
		return nil, err
	}
	t := p.tables[e.TableID]
	if t == nil {
		return nil, malformed("%s: table id %d has no table map", part, e.TableID)
	}
	if n != len(t.Columns) {
		return nil, malformed("%s: %d columns, the table map of %s.%s has %d", part, n, t.Schema, t.Table, len(t.Columns))
	}
	e.Table = t
	e.present = r.bytes((n+7)/8, "columns bitmap")
	if e.Kind == Update {
		e.presentAfter = r.bytes((n+7)/8, "after-image columns bitmap")
	}
	if err := r.err(part); err != nil {
		return nil, err
	}
	e.Partial = popcount(e.present, n) != n || e.Kind == Update && popcount(e.presentAfter, n) != n
	e.rows = r.b
	return e, nil
}
