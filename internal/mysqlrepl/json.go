package mysqlrepl

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// MySQL's binary JSON (the JSON column type, MYSQL_TYPE_JSON in a binlog),
// as mysql-server's sql-common/json_binary.h describes it:
//
//	doc     ::= type value
//	object  ::= count size key-entry* value-entry* key* value*
//	array   ::= count size value-entry* value*
//	count, size, offsets: 2 bytes (small) or 4 bytes (large), little-endian
//	key-entry   ::= key-offset key-length(2 bytes)
//	value-entry ::= type offset-or-inlined-value
//	string  ::= data-length utf8mb4-data   (data-length: 7 bits a byte, low first)
//	opaque  ::= field-type data-length data
//
// Offsets count from the start of their object or array. Literals and
// 16-bit integers are inlined in their entry, 32-bit ones too in the large
// format.
const (
	jsonSmallObject = 0x00
	jsonLargeObject = 0x01
	jsonSmallArray  = 0x02
	jsonLargeArray  = 0x03
	jsonLiteral     = 0x04
	jsonInt16       = 0x05
	jsonUint16      = 0x06
	jsonInt32       = 0x07
	jsonUint32      = 0x08
	jsonInt64       = 0x09
	jsonUint64      = 0x0a
	jsonDouble      = 0x0b
	jsonString      = 0x0c
	jsonOpaque      = 0x0f

	jsonNull  = 0x00
	jsonTrue  = 0x01
	jsonFalse = 0x02

	// jsonMaxDepth is beyond MySQL's own limit of 100 nesting levels.
	jsonMaxDepth = 150
)

// DecodeJSON returns the JSON text of a value in MySQL's binary JSON
// format (a JSON column's bytes): what SELECT prints for the column, with
// MySQL's separators (", " and ": "), keys in their stored order (MySQL
// sorts them by length, then bytes), doubles in their shortest form,
// dates and times inside the document as MySQL's strings
// ("2015-01-15 23:24:25.000000"), DECIMALs as numbers, other opaque values
// as MySQL's "base64:typeN:..." strings. An empty input is JSON null, as
// MySQL writes a JSON column's empty value. Malformed input returns an
// error wrapping ErrMalformed; it never panics, and the output is bounded
// by the input's size.
func DecodeJSON(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return []byte("null"), nil
	}
	d := jsonDecoder{budget: 16*len(b) + 1024}
	out, err := d.value(nil, b[0], b[1:], 0)
	if err != nil {
		return nil, err
	}
	return out, nil
}

type jsonDecoder struct {
	budget int // output bytes left: offsets shared between entries could otherwise multiply it
}

func jsonErr(format string, args ...any) error {
	return malformed("JSON: "+format, args...)
}

func (d *jsonDecoder) spend(n int) error {
	d.budget -= n
	if d.budget < 0 {
		return jsonErr("text much larger than its binary form: entries share values")
	}
	return nil
}

// value appends the text of the value of type typ held in data.
func (d *jsonDecoder) value(out []byte, typ byte, data []byte, depth int) ([]byte, error) {
	start := len(out)
	var err error
	switch typ {
	case jsonSmallObject, jsonLargeObject, jsonSmallArray, jsonLargeArray:
		if depth >= jsonMaxDepth {
			return nil, jsonErr("nested deeper than %d", jsonMaxDepth)
		}
		out, err = d.container(out, typ, data, depth+1)
	case jsonLiteral:
		if len(data) < 1 {
			return nil, jsonErr("truncated literal")
		}
		out, err = literal(out, data[0])
	case jsonInt16, jsonUint16, jsonInt32, jsonUint32, jsonInt64, jsonUint64, jsonDouble:
		out, err = number(out, typ, data)
	case jsonString:
		n, used, ok := jsonLength(data)
		if !ok || uint64(n) > uint64(len(data)-used) {
			return nil, jsonErr("truncated string")
		}
		out = appendJSONString(out, data[used:used+n])
	case jsonOpaque:
		out, err = opaque(out, data)
	default:
		return nil, jsonErr("value type %#x", typ)
	}
	if err != nil {
		return nil, err
	}
	if err := d.spend(len(out) - start); err != nil {
		return nil, err
	}
	return out, nil
}

func literal(out []byte, v byte) ([]byte, error) {
	switch v {
	case jsonNull:
		return append(out, "null"...), nil
	case jsonTrue:
		return append(out, "true"...), nil
	case jsonFalse:
		return append(out, "false"...), nil
	}
	return nil, jsonErr("literal %#x", v)
}

func number(out []byte, typ byte, data []byte) ([]byte, error) {
	size := map[byte]int{jsonInt16: 2, jsonUint16: 2, jsonInt32: 4, jsonUint32: 4, jsonInt64: 8, jsonUint64: 8, jsonDouble: 8}[typ]
	if len(data) < size {
		return nil, jsonErr("truncated number")
	}
	v := leUint(data[:size])
	switch typ {
	case jsonInt16:
		return strconv.AppendInt(out, int64(int16(v)), 10), nil
	case jsonInt32:
		return strconv.AppendInt(out, int64(int32(v)), 10), nil
	case jsonInt64:
		return strconv.AppendInt(out, int64(v), 10), nil
	case jsonDouble:
		return appendJSONDouble(out, math.Float64frombits(v))
	}
	return strconv.AppendUint(out, v, 10), nil
}

// appendJSONDouble writes f as MySQL does: its shortest form, with ".0"
// when it would read as an integer.
func appendJSONDouble(out []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, jsonErr("double %v", f)
	}
	start := len(out)
	out = strconv.AppendFloat(out, f, 'g', -1, 64)
	for _, c := range out[start:] {
		if c == '.' || c == 'e' {
			return out, nil
		}
	}
	return append(out, ".0"...), nil
}

// jsonLength reads a data-length: 7 bits a byte, low bits first, the top
// bit set on every byte but the last; at most 5 bytes (32 bits).
func jsonLength(b []byte) (n, used int, ok bool) {
	var v uint64
	for i := 0; i < 5 && i < len(b); i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i]&0x80 == 0 {
			if v > math.MaxUint32 {
				return 0, 0, false
			}
			return int(v), i + 1, true
		}
	}
	return 0, 0, false
}

func (d *jsonDecoder) container(out []byte, typ byte, data []byte, depth int) ([]byte, error) {
	large := typ == jsonLargeObject || typ == jsonLargeArray
	object := typ == jsonSmallObject || typ == jsonLargeObject
	w := 2
	if large {
		w = 4
	}
	read := func(off int) (int, bool) {
		if off < 0 || off+w > len(data) {
			return 0, false
		}
		return int(leUint(data[off : off+w])), true
	}
	count, ok1 := read(0)
	size, ok2 := read(w)
	if !ok1 || !ok2 || size > len(data) {
		return nil, jsonErr("truncated object or array header")
	}
	data = data[:size]
	keyEntry, valueEntry := 0, 1+w
	if object {
		keyEntry = w + 2
	}
	header := 2*w + count*(keyEntry+valueEntry)
	if count > len(data) || header > size {
		return nil, jsonErr("%d entries in %d bytes", count, size)
	}
	open, closing := byte('['), byte(']')
	if object {
		open, closing = '{', '}'
	}
	out = append(out, open)
	for i := range count {
		if i > 0 {
			out = append(out, ", "...)
		}
		if object {
			e := 2*w + i*keyEntry
			off, _ := read(e)
			n := int(binary.LittleEndian.Uint16(data[e+w:]))
			if off < header || off+n > size {
				return nil, jsonErr("key %d at %d+%d, outside its object of %d bytes", i, off, n, size)
			}
			out = appendJSONString(out, data[off:off+n])
			out = append(out, ": "...)
		}
		e := 2*w + count*keyEntry + i*valueEntry
		vt := data[e]
		var err error
		switch {
		case vt == jsonLiteral || vt == jsonInt16 || vt == jsonUint16 || large && (vt == jsonInt32 || vt == jsonUint32):
			out, err = d.value(out, vt, data[e+1:e+1+w], depth)
		default:
			off, _ := read(e + 1)
			if off < header || off >= size {
				return nil, jsonErr("value %d at %d, outside its container of %d bytes", i, off, size)
			}
			out, err = d.value(out, vt, data[off:], depth)
		}
		if err != nil {
			return nil, err
		}
	}
	return append(out, closing), nil
}

// appendJSONString writes s quoted and escaped as MySQL does: \" \\ \b \f
// \n \r \t, other control characters as \u00XX, the rest as it is
// (invalid UTF-8 as \uFFFD, which MySQL never stores).
func appendJSONString(out, s []byte) []byte {
	const hexDigits = "0123456789abcdef"
	out = append(out, '"')
	for len(s) > 0 {
		c := s[0]
		switch {
		case c == '"' || c == '\\':
			out = append(out, '\\', c)
		case c == '\b':
			out = append(out, `\b`...)
		case c == '\f':
			out = append(out, `\f`...)
		case c == '\n':
			out = append(out, `\n`...)
		case c == '\r':
			out = append(out, `\r`...)
		case c == '\t':
			out = append(out, `\t`...)
		case c < 0x20:
			out = append(out, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&15])
		case c < utf8.RuneSelf:
			out = append(out, c)
		default:
			r, n := utf8.DecodeRune(s)
			if r == utf8.RuneError && n == 1 {
				out = append(out, `\ufffd`...)
			} else {
				out = append(out, s[:n]...)
			}
			s = s[n:]
			continue
		}
		s = s[1:]
	}
	return append(out, '"')
}

// opaque writes a value of another MySQL type stored in a JSON document.
func opaque(out []byte, data []byte) ([]byte, error) {
	if len(data) < 1 {
		return nil, jsonErr("truncated opaque value")
	}
	ft := data[0]
	n, used, ok := jsonLength(data[1:])
	if !ok || uint64(n) > uint64(len(data)-1-used) {
		return nil, jsonErr("truncated opaque value")
	}
	v := data[1+used : 1+used+n]
	switch ft {
	case TypeNewDecimal:
		if len(v) < 2 {
			return nil, jsonErr("truncated DECIMAL")
		}
		r := newReader(v[2:])
		s, err := decodeDecimal(r, int(v[0]), int(v[1]))
		if err == nil {
			err = r.err("JSON DECIMAL")
		}
		if err != nil {
			return nil, err
		}
		return append(out, s.(string)...), nil
	case TypeDate, TypeDateTime, TypeTimestamp, TypeTime:
		if len(v) < 8 {
			return nil, jsonErr("truncated %s", temporalNames[ft])
		}
		s, err := packedTemporal(ft, int64(binary.LittleEndian.Uint64(v)))
		if err != nil {
			return nil, err
		}
		return strconv.AppendQuote(out, s), nil
	}
	out = append(out, fmt.Sprintf(`"base64:type%d:`, ft)...)
	out = base64.StdEncoding.AppendEncode(out, v)
	return append(out, '"'), nil
}

var temporalNames = map[byte]string{TypeDate: "DATE", TypeDateTime: "DATETIME", TypeTimestamp: "TIMESTAMP", TypeTime: "TIME"}

// packedTemporal formats a DATE, DATETIME, TIMESTAMP or TIME in MySQL's
// packed 8-byte form (my_time.h: TIME_to_longlong_packed) as a JSON
// document prints it: microseconds always, six digits.
func packedTemporal(ft byte, packed int64) (string, error) {
	if ft == TypeTime {
		neg := packed < 0
		if neg {
			packed = -packed
		}
		hms, usec := packed>>24, packed%(1<<24)
		h, m, s := (hms>>12)%(1<<10), (hms>>6)%(1<<6), hms%(1<<6)
		if m > 59 || s > 59 || usec > 999999 {
			return "", jsonErr("TIME %d:%d:%d.%d", h, m, s, usec)
		}
		sign := ""
		if neg {
			sign = "-"
		}
		return fmt.Sprintf("%s%02d:%02d:%02d.%06d", sign, h, m, s, usec), nil
	}
	if packed < 0 {
		return "", jsonErr("negative %s", temporalNames[ft])
	}
	usec, ymdhms := packed%(1<<24), packed>>24
	ymd, hms := ymdhms>>17, ymdhms%(1<<17)
	day, ym := ymd%(1<<5), ymd>>5
	month, year := ym%13, ym/13
	h, m, s := hms>>12, (hms>>6)%(1<<6), hms%(1<<6)
	if year > 9999 || month > 12 || h > 23 || m > 59 || s > 59 || usec > 999999 {
		return "", jsonErr("%s %d-%d-%d %d:%d:%d.%d", temporalNames[ft], year, month, day, h, m, s, usec)
	}
	if ft == TypeDate {
		return fmt.Sprintf("%04d-%02d-%02d", year, month, day), nil
	}
	return fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d.%06d", year, month, day, h, m, s, usec), nil
}
