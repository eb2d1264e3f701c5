// Package binlogtest builds MySQL binlog bytes for the tests of
// internal/mysqlrepl and of the MySQL 8 stand-in (internal/mysql8test):
// binary JSON documents, as mysql-server's sql-common/json_binary.h
// describes them (json_binary.cc serialize_json_value), and MySQL 8's
// events that vitess.io/vitess does not build.
package binlogtest

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The binary JSON value types (json_binary.h).
const (
	jsonSmallObject = 0x00
	jsonSmallArray  = 0x02
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
)

// Object is a JSON object: its members, key (a string) and value, in the
// order given (MySQL sorts the keys by length, then bytes: give them so).
type Object [][2]any

// Opaque is a value of another MySQL type in a document (a DECIMAL, a
// DATETIME...): its field type and bytes.
type Opaque struct {
	Type byte
	Data []byte
}

func varLen(n int) []byte {
	var b []byte
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if n == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// JSON returns the document v in MySQL's binary format: nil, bool, int,
// uint64, float64, string, []any, Object and Opaque values, in the small
// format unless large.
func JSON(v any, large bool) []byte {
	t, b := value(v, large)
	return append([]byte{t}, b...)
}

func value(v any, large bool) (byte, []byte) {
	switch x := v.(type) {
	case nil:
		return jsonLiteral, []byte{jsonNull}
	case bool:
		if x {
			return jsonLiteral, []byte{jsonTrue}
		}
		return jsonLiteral, []byte{jsonFalse}
	case int:
		switch {
		case x >= math.MinInt16 && x <= math.MaxInt16:
			return jsonInt16, binary.LittleEndian.AppendUint16(nil, uint16(x))
		case x >= math.MinInt32 && x <= math.MaxInt32:
			return jsonInt32, binary.LittleEndian.AppendUint32(nil, uint32(x))
		}
		return jsonInt64, binary.LittleEndian.AppendUint64(nil, uint64(x))
	case uint64:
		return jsonUint64, binary.LittleEndian.AppendUint64(nil, x)
	case float64:
		return jsonDouble, binary.LittleEndian.AppendUint64(nil, math.Float64bits(x))
	case string:
		return jsonString, append(varLen(len(x)), x...)
	case Opaque:
		return jsonOpaque, append(append([]byte{x.Type}, varLen(len(x.Data))...), x.Data...)
	case []any:
		return container(nil, x, large)
	case Object:
		keys := make([]string, len(x))
		vals := make([]any, len(x))
		for i, kv := range x {
			keys[i], vals[i] = kv[0].(string), kv[1]
		}
		return container(keys, vals, large) // keys not nil: an object
	}
	panic(fmt.Sprintf("binlogtest.JSON: a %T", v))
}

func container(keys []string, vals []any, large bool) (byte, []byte) {
	w := 2
	typ := byte(jsonSmallArray)
	if keys != nil {
		typ = jsonSmallObject
	}
	if large {
		w = 4
		typ++
	}
	put := func(b []byte, v int) []byte {
		if w == 2 {
			return binary.LittleEndian.AppendUint16(b, uint16(v))
		}
		return binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	object := keys != nil
	keyEntry := 0
	if object {
		keyEntry = w + 2
	}
	header := 2*w + len(vals)*(keyEntry+1+w)
	var tail []byte
	var entries []byte
	if object {
		for _, k := range keys {
			entries = put(entries, header+len(tail))
			entries = binary.LittleEndian.AppendUint16(entries, uint16(len(k)))
			tail = append(tail, k...)
		}
	}
	for _, v := range vals {
		t, b := value(v, large)
		entries = append(entries, t)
		inline := t == jsonLiteral || t == jsonInt16 || t == jsonUint16 || large && (t == jsonInt32 || t == jsonUint32)
		if inline {
			entries = append(entries, b...)
			entries = append(entries, make([]byte, w-len(b))...)
			continue
		}
		entries = put(entries, header+len(tail))
		tail = append(tail, b...)
	}
	var out []byte
	out = put(out, len(vals))
	out = put(out, header+len(tail))
	out = append(out, entries...)
	return typ, append(out, tail...)
}

// PackedDateTime is a DATE, DATETIME or TIMESTAMP in MySQL's packed form
// (TIME_to_longlong_datetime_packed), as a JSON document stores it.
func PackedDateTime(y, mo, d, h, mi, s, us int64) []byte {
	ymd := (y*13+mo)<<5 | d
	hms := h<<12 | mi<<6 | s
	return binary.LittleEndian.AppendUint64(nil, uint64((ymd<<17|hms)<<24+us))
}

// PackedTime is a TIME in MySQL's packed form
// (TIME_to_longlong_time_packed), as a JSON document stores it.
func PackedTime(neg bool, h, mi, s, us int64) []byte {
	v := (h<<12|mi<<6|s)<<24 + us
	if neg {
		v = -v
	}
	return binary.LittleEndian.AppendUint64(nil, uint64(v))
}
