package mysqlrepl

import "fmt"

// Column types (Column.Type), as the binlog writes them (MYSQL_TYPE_*).
// ENUM and SET columns are written as TypeString with their real type in
// Meta; TINY/MEDIUM/LONG BLOB and TEXT as TypeBlob with the length's size
// in Meta.
const (
	TypeDecimal           byte = 0 // pre-5.0 DECIMAL: refused
	TypeTiny              byte = 1
	TypeShort             byte = 2
	TypeLong              byte = 3
	TypeFloat             byte = 4
	TypeDouble            byte = 5
	TypeNull              byte = 6
	TypeTimestamp         byte = 7 // pre-5.6 TIMESTAMP: refused
	TypeLongLong          byte = 8
	TypeInt24             byte = 9
	TypeDate              byte = 10
	TypeTime              byte = 11 // pre-5.6 TIME: refused
	TypeDateTime          byte = 12 // pre-5.6 DATETIME: refused
	TypeYear              byte = 13
	TypeNewDate           byte = 14 // never in a binlog
	TypeVarchar           byte = 15
	TypeBit               byte = 16
	TypeTimestamp2        byte = 17
	TypeDateTime2         byte = 18
	TypeTime2             byte = 19
	TypeVarcharCompressed byte = 140 // MariaDB compressed column: refused
	TypeBlobCompressed    byte = 141 // MariaDB compressed column: refused
	TypeJSON              byte = 245 // MySQL binary JSON (MariaDB's JSON is a TypeBlob)
	TypeNewDecimal        byte = 246
	TypeEnum              byte = 247
	TypeSet               byte = 248
	TypeTinyBlob          byte = 249
	TypeMediumBlob        byte = 250
	TypeLongBlob          byte = 251
	TypeBlob              byte = 252
	TypeVarString         byte = 253
	TypeString            byte = 254
	TypeGeometry          byte = 255
)

var typeNames = map[byte]string{
	TypeDecimal: "DECIMAL (old)", TypeTiny: "TINY", TypeShort: "SHORT", TypeLong: "LONG", TypeFloat: "FLOAT",
	TypeDouble: "DOUBLE", TypeNull: "NULL", TypeTimestamp: "TIMESTAMP (old)", TypeLongLong: "LONGLONG",
	TypeInt24: "INT24", TypeDate: "DATE", TypeTime: "TIME (old)", TypeDateTime: "DATETIME (old)",
	TypeYear: "YEAR", TypeNewDate: "NEWDATE", TypeVarchar: "VARCHAR", TypeBit: "BIT",
	TypeTimestamp2: "TIMESTAMP2", TypeDateTime2: "DATETIME2", TypeTime2: "TIME2",
	TypeVarcharCompressed: "VARCHAR_COMPRESSED", TypeBlobCompressed: "BLOB_COMPRESSED",
	TypeJSON: "JSON (MySQL binary)", TypeNewDecimal: "NEWDECIMAL", TypeEnum: "ENUM", TypeSet: "SET",
	TypeTinyBlob: "TINY_BLOB", TypeMediumBlob: "MEDIUM_BLOB", TypeLongBlob: "LONG_BLOB", TypeBlob: "BLOB",
	TypeVarString: "VAR_STRING", TypeString: "STRING", TypeGeometry: "GEOMETRY",
}

func typeName(t byte) string {
	if s, ok := typeNames[t]; ok {
		return fmt.Sprintf("%s (%d)", s, t)
	}
	return fmt.Sprintf("type %d", t)
}

// TableMapEvent (TABLE_MAP_EVENT) describes the table of the rows events
// that follow it, under a table id valid until the next format description.
type TableMapEvent struct {
	Header
	// TableID is the id the rows events refer to.
	TableID uint64
	// Schema and Table name the table.
	Schema, Table string
	// Columns describe the table's columns, in order.
	Columns []Column
	// PrimaryKey holds the indexes in Columns of the primary key's columns,
	// from the optional metadata (binlog_row_metadata MINIMAL or FULL); nil
	// without it.
	PrimaryKey []int
}

// Column is a column of a TableMapEvent.
type Column struct {
	// Type is the binlog type (TypeVarchar, TypeBlob, TypeDateTime2...).
	Type byte
	// Meta is the type's metadata: a length, a precision and scale, a
	// fractional-second precision... as the binlog writes it.
	Meta uint16
	// Nullable reports that the column accepts NULL.
	Nullable bool
	// Name is the column's name, from the optional metadata of
	// binlog_row_metadata=FULL; "" without it.
	Name string
	// Unsigned reports an UNSIGNED numeric column, from the optional
	// metadata (binlog_row_metadata MINIMAL or FULL); false without it,
	// unless a reader that knows the table's columns otherwise sets it
	// before decoding the rows.
	Unsigned bool
	// EnumValues are the values of an ENUM column (index 1 is
	// EnumValues[0]), SetValues those of a SET column (bit i is
	// SetValues[i]), from the optional metadata of binlog_row_metadata=FULL.
	EnumValues, SetValues []string
	// Collation is the collation id of a character column (CHAR, VARCHAR,
	// TEXT; BINARY, VARBINARY and BLOB have 63, binary) from the optional
	// metadata of MySQL's binlog_row_metadata=FULL; 0 without it. The
	// ids of MySQL 8's utf8mb4_0900_* collations are 255 and above; the
	// bytes of a column are its character set's, whatever the collation.
	Collation uint16
}

// CollationBinary is the collation id of binary strings (BINARY,
// VARBINARY, BLOB).
const CollationBinary = 63

// RealType returns the column's type with ENUM and SET told apart from
// TypeString (which the binlog writes for all three).
func (c Column) RealType() byte {
	t, _ := c.stringType()
	return t
}

// FixedLength returns the length in bytes of a CHAR or BINARY column
// (RealType TypeString), 0 for other types.
func (c Column) FixedLength() int {
	if t, n := c.stringType(); t == TypeString {
		return n
	}
	return 0
}

// stringType returns the real type and the length (pack length for ENUM
// and SET) of a TypeString, TypeEnum or TypeSet column; the type itself
// otherwise.
func (c Column) stringType() (byte, int) {
	switch c.Type {
	case TypeString:
		if c.Meta < 256 {
			return TypeString, int(c.Meta)
		}
		b0, b1 := byte(c.Meta>>8), byte(c.Meta)
		if b0&0x30 != 0x30 {
			// A CHAR longer than 255 bytes keeps the top bits of its
			// length in bits 4-5 of the type byte, inverted.
			return b0 | 0x30, int(b1) | int((b0&0x30)^0x30)<<4
		}
		return b0, int(b1)
	case TypeEnum, TypeSet:
		return c.Type, int(c.Meta & 0xff)
	}
	return c.Type, 0
}

// metaSize returns how many metadata bytes the table map holds for type t,
// or -1 for a type it cannot hold.
func metaSize(t byte) int {
	switch t {
	case TypeFloat, TypeDouble, TypeBlob, TypeTinyBlob, TypeMediumBlob, TypeLongBlob, TypeGeometry,
		TypeJSON, TypeTime2, TypeDateTime2, TypeTimestamp2, TypeBlobCompressed:
		return 1
	case TypeVarchar, TypeVarString, TypeBit, TypeVarcharCompressed, TypeNewDecimal, TypeString, TypeEnum, TypeSet:
		return 2
	case TypeDecimal, TypeTiny, TypeShort, TypeLong, TypeNull, TypeTimestamp, TypeLongLong, TypeInt24,
		TypeDate, TypeTime, TypeDateTime, TypeYear, TypeNewDate:
		return 0
	}
	return -1
}

// isNumeric reports whether the SIGNEDNESS optional metadata has a bit for
// columns of type t: MariaDB's types whose field has a sign, YEAR
// included; MySQL's is_numeric_type, which leaves YEAR out.
func isNumeric(t byte, mysql bool) bool {
	switch t {
	case TypeTiny, TypeShort, TypeInt24, TypeLong, TypeLongLong, TypeFloat, TypeDouble, TypeNewDecimal:
		return true
	case TypeDecimal, TypeYear:
		return !mysql
	}
	return false
}

// isCharacter reports whether the charset optional metadata of MySQL
// (DEFAULT_CHARSET, COLUMN_CHARSET) covers a column: MySQL's
// is_character_type of its real type (ENUM and SET have fields of their
// own).
func isCharacter(c Column) bool {
	switch c.RealType() {
	case TypeString, TypeVarString, TypeVarchar, TypeBlob:
		return true
	}
	return false
}

// Optional metadata field types of TABLE_MAP_EVENT.
const (
	optSignedness           = 1
	optDefaultCharset       = 2
	optColumnCharset        = 3
	optColumnName           = 4
	optSetStrValue          = 5
	optEnumStrValue         = 6
	optSimplePrimaryKey     = 8
	optPrimaryKeyWithPrefix = 9
)

// tableIDLen returns the size of the table id in the post-header of t.
func (p *Parser) tableIDLen(t EventType, def int) int {
	if p.postHeaderLen(t, def) == 6 {
		return 4 // MySQL 5.1.3 and older
	}
	return 6
}

func (p *Parser) parseTableMap(h Header, body []byte) (Event, error) {
	const part = "TABLE_MAP_EVENT"
	r := newReader(body)
	e := &TableMapEvent{Header: h}
	e.TableID = r.uN(p.tableIDLen(TableMapEventType, 8), "table id")
	r.skip(2, "flags")
	e.Schema = string(r.bytes(int(r.u8("schema length")), "schema"))
	r.skip(1, "schema terminator")
	e.Table = string(r.bytes(int(r.u8("table length")), "table"))
	r.skip(1, "table terminator")
	n := r.count("column count", len(r.b))
	types := r.bytes(n, "column types")
	metaLen := r.count("metadata length", len(r.b))
	meta := r.bytes(metaLen, "metadata")
	nulls := r.bytes((n+7)/8, "null bitmap")
	if err := r.err(part); err != nil {
		return nil, err
	}
	e.Columns = make([]Column, n)
	mr := newReader(meta)
	for i, t := range types {
		c := &e.Columns[i]
		c.Type = t
		c.Nullable = nulls[i/8]&(1<<(i%8)) != 0
		switch metaSize(t) {
		case 0:
		case 1:
			c.Meta = uint16(mr.u8("metadata"))
		case 2:
			b := mr.bytes(2, "metadata")
			if b == nil {
				break
			}
			switch t {
			case TypeNewDecimal, TypeString, TypeEnum, TypeSet:
				c.Meta = uint16(b[0])<<8 | uint16(b[1])
			default:
				c.Meta = uint16(b[0]) | uint16(b[1])<<8
			}
		default:
			return nil, unsupported("%s: column %d of %s.%s has %s", part, i, e.Schema, e.Table, typeName(t))
		}
	}
	if err := mr.err(part + " metadata"); err != nil {
		return nil, err
	}
	if len(mr.b) != 0 {
		return nil, malformed("%s: %d bytes of metadata left over", part, len(mr.b))
	}
	if err := e.parseOptional(r.b, p.mysql); err != nil {
		return nil, err
	}
	if p.tables == nil {
		p.tables = make(map[uint64]*TableMapEvent)
	}
	p.tables[e.TableID] = e
	return e, nil
}

// parseOptional reads the optional metadata fields (type, length, value)
// that binlog_row_metadata adds after the null bitmap; unknown fields are
// skipped.
func (e *TableMapEvent) parseOptional(b []byte, mysql bool) error {
	const part = "TABLE_MAP_EVENT optional metadata"
	r := newReader(b)
	for r.ok && len(r.b) > 0 {
		typ := r.u8("field type")
		v := r.bytes(r.count("field length", len(r.b)), "field")
		if !r.ok {
			break
		}
		fr := newReader(v)
		switch typ {
		case optSignedness:
			var k int
			for i := range e.Columns {
				if !isNumeric(e.Columns[i].Type, mysql) {
					continue
				}
				if k/8 >= len(v) {
					return malformed("%s: SIGNEDNESS has %d bytes for more numeric columns", part, len(v))
				}
				e.Columns[i].Unsigned = v[k/8]&(0x80>>(k%8)) != 0
				k++
			}
		case optDefaultCharset, optColumnCharset:
			if !mysql {
				continue
			}
			if err := e.charsets(fr, typ == optDefaultCharset); err != nil {
				return err
			}
		case optColumnName:
			for i := range e.Columns {
				e.Columns[i].Name = string(fr.bytes(fr.count("column name length", len(fr.b)), "column name"))
			}
		case optEnumStrValue, optSetStrValue:
			want := TypeEnum
			if typ == optSetStrValue {
				want = TypeSet
			}
			for i := range e.Columns {
				if e.Columns[i].RealType() != want {
					continue
				}
				m := fr.count("value count", len(fr.b))
				vals := make([]string, 0, m)
				for range m {
					vals = append(vals, string(fr.bytes(fr.count("value length", len(fr.b)), "value")))
				}
				if want == TypeEnum {
					e.Columns[i].EnumValues = vals
				} else {
					e.Columns[i].SetValues = vals
				}
			}
		case optSimplePrimaryKey, optPrimaryKeyWithPrefix:
			e.PrimaryKey = nil
			for fr.ok && len(fr.b) > 0 {
				k := fr.lenenc("primary key column")
				if typ == optPrimaryKeyWithPrefix {
					fr.lenenc("primary key prefix")
				}
				if fr.ok && k >= uint64(len(e.Columns)) {
					return malformed("%s: primary key column %d of %d", part, k, len(e.Columns))
				}
				e.PrimaryKey = append(e.PrimaryKey, int(k))
			}
		default:
			continue
		}
		if err := fr.err(part); err != nil {
			return err
		}
	}
	return r.err(part)
}

// charsets reads MySQL's DEFAULT_CHARSET (a default collation, then the
// character columns, counted among those, with another one) or
// COLUMN_CHARSET (a collation for each character column) into the
// columns' Collation.
func (e *TableMapEvent) charsets(fr *reader, withDefault bool) error {
	var chars []int
	for i := range e.Columns {
		if isCharacter(e.Columns[i]) {
			chars = append(chars, i)
		}
	}
	collation := func() uint16 {
		v := fr.lenenc("collation")
		if v > 0xffff {
			fr.fail("collation (too large)")
		}
		return uint16(v)
	}
	if !withDefault {
		for _, i := range chars {
			e.Columns[i].Collation = collation()
		}
		return nil
	}
	def := collation()
	for _, i := range chars {
		e.Columns[i].Collation = def
	}
	for fr.ok && len(fr.b) > 0 {
		k := fr.lenenc("character column")
		c := collation()
		if fr.ok && k >= uint64(len(chars)) {
			return malformed("TABLE_MAP_EVENT optional metadata: character column %d of %d", k, len(chars))
		}
		if fr.ok {
			e.Columns[chars[k]].Collation = c
		}
	}
	return nil
}
