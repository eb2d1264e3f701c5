package textenc

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"unicode/utf8"
)

var samples = []string{
	"", "plain", "crème brûlée", `Post "http://x/y?a=\u00e9": dial tcp: connection refused`,
	`C:\path\to\file`, `{"a":1}`, `"\u0000"`, "nul\x00inside", "\xff\xfe", "bad \xc3 utf8",
	"trailing space ", " leading space", "tab\t", "line\nbreak", Prefix, Prefix + `"x"`,
	Prefix + "not quoted", `\x00`, strings.Repeat("é", 1000), "\u2028\ufffd\U0001F600",
}

func TestRoundTrip(t *testing.T) {
	for _, s := range samples {
		e := Encode(s)
		if got := Decode(e); got != s {
			t.Errorf("Decode(Encode(%q)) = %q", s, got)
		}
		if !storable(e) {
			t.Errorf("Encode(%q) = %q: not storable text", s, e)
		}
		if Plain(s) != (e == s) {
			t.Errorf("Encode(%q) = %q: plain text must be kept, other text encoded", s, e)
		}
	}
}

func TestPlainKept(t *testing.T) {
	for _, s := range []string{"", "order.order.placed.v1", `{"a":1}`, `"\u0000"`, `back\slash`, "é"} {
		if Encode(s) != s {
			t.Errorf("Encode(%q) = %q, want it unchanged", s, Encode(s))
		}
	}
	for _, s := range []string{"a\x00", "\xff", "a ", Prefix + "x"} {
		if Encode(s) == s {
			t.Errorf("Encode(%q) left it unchanged", s)
		}
	}
}

func TestMap(t *testing.T) {
	m := map[string]string{}
	for i, s := range samples {
		m[s] = samples[len(samples)-1-i]
	}
	raw, err := EncodeMap(m)
	if err != nil {
		t.Fatal(err)
	}
	var stored map[string]string
	if err := json.Unmarshal([]byte(raw), &stored); err != nil || !utf8.ValidString(raw) {
		t.Fatalf("EncodeMap = %q: not JSON (%v)", raw, err)
	}
	for k, v := range stored {
		if !storable(k) || !storable(v) {
			t.Errorf("EncodeMap stored %q: %q: not storable text", k, v)
		}
	}
	got, err := DecodeMap([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, m) {
		t.Errorf("DecodeMap(EncodeMap(m)) = %q, want %q", got, m)
	}
	if raw, _ := EncodeMap(nil); raw != "{}" {
		t.Errorf("EncodeMap(nil) = %q", raw)
	}
	if got, err := DecodeMap([]byte("{}")); err != nil || got != nil {
		t.Errorf("DecodeMap({}) = %v, %v", got, err)
	}
}

func FuzzRoundTrip(f *testing.F) {
	for _, s := range samples {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := Encode(s)
		if Decode(e) != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, Decode(e))
		}
		if !storable(e) {
			t.Fatalf("Encode(%q) = %q: not storable", s, e)
		}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var back string
		if err := json.Unmarshal(b, &back); err != nil || back != e {
			t.Fatalf("JSON round trip of %q = %q, %v", e, back, err)
		}
	})
}

// storable reports whether every dialect keeps s as it is: valid UTF-8
// without NUL (PostgreSQL), without a trailing space (MySQL's PAD SPACE).
func storable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0) && !strings.HasSuffix(s, " ")
}
