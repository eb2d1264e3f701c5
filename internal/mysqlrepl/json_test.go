package mysqlrepl

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/idem-go/idem/internal/mysqlrepl/binlogtest"
)

// sameJSON reports whether two JSON texts have the same value (numbers
// as float64).
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	if err := da.Decode(&va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := db.Decode(&vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

func TestDecodeJSON(t *testing.T) {
	// The opaque values are those of mysql-server's
	// unittest/gunit/json_binary-t.cc (BasicTest: the TINY_BLOB
	// 0xCAFEBABE and the DECIMAL 123.45; DateAndTimeTest: the TIME, DATE
	// and DATETIME), which MySQL prints as below.
	dec := append([]byte{5, 2}, encDecimal("123.45", 5, 2)...)
	cases := []struct {
		name string
		doc  any
		want string
	}{
		{"false", false, `false`},
		{"int", -123, `-123`},
		{"double", 3.14, `3.14`},
		{"double integral", 2.0, `2.0`},
		{"double exponent", 1e300, `1e+300`},
		{"uint64 max", uint64(math.MaxUint64), `18446744073709551615`},
		{"int64 min", math.MinInt64, `-9223372036854775808`},
		{"int32", -70000, `-70000`},
		{"string", "abc", `"abc"`},
		{"escapes", "q\"b\\s/\b\f\n\r\t\x01\x1f é 😀", `"q\"b\\s/\b\f\n\r\t\u0001\u001f é 😀"`},
		{"array", []any{1, 2, 3}, `[1, 2, 3]`},
		{"nested", []any{1, []any{"a", []any{3.14}}}, `[1, ["a", [3.14]]]`},
		{"object", binlogtest.Object{{"key", "val"}}, `{"key": "val"}`},
		{"object with array", binlogtest.Object{{"a", "b"}, {"c", []any{"d"}}}, `{"a": "b", "c": ["d"]}`},
		{"literals and empties", []any{true, false, nil, 0, "0", "", binlogtest.Object{}, []any{}}, `[true, false, null, 0, "0", "", {}, []]`},
		{"keys in stored order", binlogtest.Object{{"", 9}, {"a", 6}, {"b", 8}, {"ab", 7}, {"key1", 1}, {"key2", 2}, {"key1\x00x", 4}}, `{"": 9, "a": 6, "b": 8, "ab": 7, "key1": 1, "key2": 2, "key1\u0000x": 4}`},
		{"blob", binlogtest.Opaque{Type: TypeTinyBlob, Data: []byte{0xbe, 0xba, 0xfe, 0xca}}, `"base64:type249:vrr+yg=="`},
		{"decimal", binlogtest.Opaque{Type: TypeNewDecimal, Data: dec}, `123.45`},
		{"time", binlogtest.Opaque{Type: TypeTime, Data: binlogtest.PackedTime(false, 13, 14, 15, 654321)}, `"13:14:15.654321"`},
		{"negative time", binlogtest.Opaque{Type: TypeTime, Data: binlogtest.PackedTime(true, 838, 59, 59, 0)}, `"-838:59:59.000000"`},
		{"date", binlogtest.Opaque{Type: TypeDate, Data: binlogtest.PackedDateTime(2014, 5, 17, 0, 0, 0, 0)}, `"2014-05-17"`},
		{"datetime", binlogtest.Opaque{Type: TypeDateTime, Data: binlogtest.PackedDateTime(2015, 1, 15, 15, 16, 17, 123456)}, `"2015-01-15 15:16:17.123456"`},
		{"timestamp", binlogtest.Opaque{Type: TypeTimestamp, Data: binlogtest.PackedDateTime(2015, 1, 15, 15, 16, 17, 0)}, `"2015-01-15 15:16:17.000000"`},
		{"outbox payload", binlogtest.Object{{"id", 42}, {"sku", "A-1"}, {"items", []any{binlogtest.Object{{"q", 2}, {"price", 9.5}}}}, {"customer", nil}}, `{"id": 42, "sku": "A-1", "items": [{"q": 2, "price": 9.5}], "customer": null}`},
	}
	for _, c := range cases {
		for _, large := range []bool{false, true} {
			got, err := DecodeJSON(binlogtest.JSON(c.doc, large))
			if err != nil || string(got) != c.want {
				t.Errorf("%s (large %v): %s, %v; want %s", c.name, large, got, err, c.want)
				continue
			}
			if !json.Valid(got) {
				t.Errorf("%s: %s is not valid JSON", c.name, got)
			}
		}
	}
	if got, err := DecodeJSON(nil); err != nil || string(got) != "null" {
		t.Errorf("empty value: %s, %v; want null", got, err)
	}
	// A document large enough for the large format by itself.
	var big []any
	for range 20000 {
		big = append(big, true, false, nil, "a")
	}
	got, err := DecodeJSON(binlogtest.JSON(big, true))
	want, _ := json.Marshal(big)
	if err != nil || !sameJSON(t, got, want) {
		t.Errorf("an array of 80000 values: %v", err)
	}
}

func TestDecodeJSONMalformed(t *testing.T) {
	good := binlogtest.JSON(binlogtest.Object{{"a", []any{1, "x"}}}, false)
	// Every value entry of an array of 100 points at the one array, itself
	// of 100 entries pointing at one array...: the text would be 100^n.
	bomb := []byte{jsonString, 1, 'x'}
	bombType := byte(jsonString)
	for range 4 {
		n := 100
		header := 4 + 3*n
		b := binary.LittleEndian.AppendUint16(nil, uint16(n))
		b = binary.LittleEndian.AppendUint16(b, uint16(header+len(bomb)-1))
		for range n {
			b = append(b, bombType)
			b = binary.LittleEndian.AppendUint16(b, uint16(header))
		}
		b = append(b, bomb[1:]...)
		bomb, bombType = append([]byte{jsonSmallArray}, b...), jsonSmallArray
	}
	deep := []byte{jsonLiteral, jsonNull}
	for range 200 {
		// An array of one entry whose value is the previous document.
		b := binary.LittleEndian.AppendUint16(nil, 1)
		b = binary.LittleEndian.AppendUint16(b, uint16(7+len(deep)-1))
		b = append(b, deep[0])
		b = binary.LittleEndian.AppendUint16(b, 7)
		deep = append([]byte{jsonSmallArray}, append(b, deep[1:]...)...)
		if len(deep) > 60000 {
			break
		}
	}
	for name, in := range map[string][]byte{
		"truncated":         good[:len(good)-1],
		"unknown type":      {0x0d, 0},
		"bad literal":       {jsonLiteral, 7},
		"short int":         {jsonInt64, 1, 2},
		"string too long":   {jsonString, 5, 'a'},
		"length too long":   {jsonString, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"NaN":               append([]byte{jsonDouble}, binary.LittleEndian.AppendUint64(nil, math.Float64bits(math.NaN()))...),
		"key out of bounds": {jsonSmallObject, 1, 0, 12, 0, 200, 0, 1, 0, jsonLiteral, 0, 0, 'a'},
		"value offset":      {jsonSmallArray, 1, 0, 7, 0, jsonString, 2, 0},
		"count too large":   {jsonSmallArray, 0xff, 0xff, 7, 0},
		"bad datetime":      append([]byte{jsonOpaque, TypeDateTime, 8}, binlogtest.PackedDateTime(2015, 1, 1, 25, 0, 0, 0)...),
		"short datetime":    {jsonOpaque, TypeDateTime, 2, 0, 0},
		"bad decimal":       {jsonOpaque, TypeNewDecimal, 2, 70, 2},
		"shared values":     bomb,
		"too deep":          deep,
	} {
		if got, err := DecodeJSON(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %.80s, %v; want ErrMalformed", name, got, err)
		}
	}
}

// FuzzDecodeJSON decodes any bytes: nothing may panic, what decodes is
// valid JSON of bounded size, and documents built from fuzzed values
// decode to the text of those values.
func FuzzDecodeJSON(f *testing.F) {
	f.Add(binlogtest.JSON(binlogtest.Object{{"a", "b"}, {"ab", []any{1, 2.5, nil, true}}}, false), "x", int64(3))
	f.Add(binlogtest.JSON([]any{binlogtest.Opaque{Type: TypeDateTime, Data: binlogtest.PackedDateTime(2015, 1, 15, 15, 16, 17, 1)}, uint64(7)}, true), "é\n", int64(-70000))
	f.Add([]byte{jsonOpaque, TypeNewDecimal, 4, 5, 2, 0x80, 0}, "", int64(0))
	f.Fuzz(func(t *testing.T, data []byte, s string, n int64) {
		if out, err := DecodeJSON(data); err == nil {
			if !json.Valid(out) {
				t.Fatalf("%x decoded to invalid JSON %s", data, out)
			}
			if len(out) > 16*len(data)+1024 {
				t.Fatalf("%d bytes decoded to %d", len(data), len(out))
			}
		}
		doc := binlogtest.Object{{"n", int(n)}, {"s", s}, {"arr", []any{s, float64(n) / 3, nil}}}
		for _, large := range []bool{false, true} {
			out, err := DecodeJSON(binlogtest.JSON(doc, large))
			if err != nil {
				t.Fatal(err)
			}
			want, _ := json.Marshal(map[string]any{"n": n, "s": s, "arr": []any{s, float64(n) / 3, nil}})
			if !json.Valid(out) || !sameJSON(t, out, want) {
				t.Fatalf("%s, want the value of %s", out, want)
			}
		}
	})
}
