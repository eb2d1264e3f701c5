// Package textenc stores arbitrary strings in text and JSON columns of every
// dialect, byte for byte.
//
// PostgreSQL's text and jsonb, and MySQL's utf8mb4 columns, reject invalid
// UTF-8; PostgreSQL also rejects NUL (jsonb even as \u0000); MySQL's PAD
// SPACE collations compare "a" and "a " as equal. A failed message may hold
// any of these in its error text, headers or event name. Encode keeps plain
// text as it is, readable with SQL, and writes any other string as Prefix
// followed by the string as a Go double-quoted literal (strconv.Quote: \x00,
// \xff, \", \\ ...), which is valid UTF-8 without NUL and ends with a quote.
// A plain string that starts with Prefix is encoded too, so that Decode is
// never ambiguous.
//
// Encoding is deterministic: equality filters compare the encoded filter
// value with the stored one.
package textenc

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Prefix starts every encoded string.
const Prefix = "idem:quoted:"

// Plain reports whether s is stored as it is: valid UTF-8, no NUL, no
// trailing space, and not starting with Prefix.
func Plain(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0) &&
		!strings.HasSuffix(s, " ") && !strings.HasPrefix(s, Prefix)
}

// Encode returns s as stored: s itself when Plain, else Prefix and s quoted.
func Encode(s string) string {
	if Plain(s) {
		return s
	}
	return Prefix + strconv.Quote(s)
}

// Decode returns the string Encode stored as s. A value that starts with
// Prefix without a valid quoted string after it (written by another
// program) is returned as it is.
func Decode(s string) string {
	rest, ok := strings.CutPrefix(s, Prefix)
	if !ok || !strings.HasPrefix(rest, `"`) {
		return s
	}
	u, err := strconv.Unquote(rest)
	if err != nil {
		return s
	}
	return u
}

// EncodeMap returns the JSON object of m with its keys and values encoded;
// "{}" for an empty or nil map.
func EncodeMap(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	enc := make(map[string]string, len(m))
	for k, v := range m {
		enc[Encode(k)] = Encode(v)
	}
	b, err := json.Marshal(enc)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// DecodeMap reads a JSON object written by EncodeMap (or by an older
// version, with plain strings) and decodes its keys and values. Values that
// are not strings (written by another program) keep their JSON text. An
// empty object or null gives nil.
func DecodeMap(raw []byte) (map[string]string, error) {
	var enc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &enc); err != nil {
		return nil, err
	}
	if len(enc) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(enc))
	for k, raw := range enc {
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			v = string(raw)
		}
		m[Decode(k)] = Decode(v)
	}
	return m, nil
}
