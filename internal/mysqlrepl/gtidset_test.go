package mysqlrepl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

const (
	uuidA = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	uuidB = "7c2f6a3e-0b1d-11ef-8a4b-0242ac120002"
)

func mustSID(t testing.TB, s string) SID {
	t.Helper()
	sid, err := ParseSID(s)
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

func TestParseGTIDSet(t *testing.T) {
	for in, want := range map[string]string{
		"":                                    "",
		"  \n":                                "",
		uuidA + ":1-5":                        uuidA + ":1-5",
		strings.ToUpper(uuidA) + ":1-5:11-18": uuidA + ":1-5:11-18",
		uuidB + ":1-3,\n" + uuidA + ":7":      uuidA + ":7," + uuidB + ":1-3",
		uuidA + ":1-5:6-9:20-20:3":            uuidA + ":1-9:20",
		uuidA + ":11-18, " + uuidA + ":1-10":  uuidA + ":1-18",
		uuidA + ":5-7:1-2":                    uuidA + ":1-2:5-7",
		uuidA + ":1-9223372036854775806":      uuidA + ":1-9223372036854775806",
		uuidA + ":1-4:6-8:5":                  uuidA + ":1-8",
		uuidA + ":10:1:5":                     uuidA + ":1:5:10",
		uuidA + " : 1-3 ":                     uuidA + ":1-3",
		uuidA + ":1-3," + uuidB + ":2," + uuidB + ":4-6:3": uuidA + ":1-3," + uuidB + ":2-6",
	} {
		s, err := ParseGTIDSet(in)
		if err != nil || s.String() != want {
			t.Errorf("ParseGTIDSet(%q) = %q, %v; want %q", in, s, err, want)
		}
	}
	for in, want := range map[string]string{
		"3e11fa47-71ca-11e1-9e33:1":              "8-4-4-4-12",
		uuidA:                                    "without a transaction interval",
		uuidA + ":0-3":                           "1 <= N",
		uuidA + ":5-3":                           "1 <= N",
		uuidA + ":1-9223372036854775807":         "1 <= N",
		uuidA + ":x":                             "tagged",
		uuidA + ":tag1:1-5":                      "tagged",
		uuidA + ":1-":                            "want N or N-M",
		uuidA + ":1-5,":                          "8-4-4-4-12",
		"zz11fa47-71ca-11e1-9e33-c80aa9429562:1": "hexadecimal",
	} {
		if _, err := ParseGTIDSet(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseGTIDSet(%q): %v, want an error saying %q", in, err, want)
		}
	}
	if _, err := ParseGTIDSet(uuidA + ":tag1:1-5"); !errors.Is(err, ErrUnsupported) {
		t.Errorf("a tagged GTID: %v, want ErrUnsupported", err)
	}
}

func TestGTIDSetAddContains(t *testing.T) {
	a, b := mustSID(t, uuidA), mustSID(t, uuidB)
	s, _ := ParseGTIDSet(uuidA + ":1-5:8")
	orig := s
	s.Add(a, 6)
	s.Add(a, 7)
	s.Add(b, 1)
	s.Add(a, 0) // ignored
	if got, want := s.String(), uuidA+":1-8,"+uuidB+":1"; got != want {
		t.Errorf("after Add: %s, want %s", got, want)
	}
	if orig.String() != uuidA+":1-5:8" {
		t.Errorf("Add changed the copy it was made from: %s", orig)
	}
	for gno, want := range map[uint64]bool{0: false, 1: true, 5: true, 8: true, 9: false} {
		if s.Contains(a, gno) != want {
			t.Errorf("Contains(%d) = %v", gno, !want)
		}
	}
	if s.Contains(b, 2) || !s.Contains(b, 1) {
		t.Error("Contains of the second source wrong")
	}
	sub, _ := ParseGTIDSet(uuidA + ":2-4:8")
	if !s.ContainsSet(sub) || sub.ContainsSet(s) || !s.ContainsSet(GTIDSet{}) {
		t.Error("ContainsSet wrong")
	}
	other, _ := ParseGTIDSet(uuidA + ":8-9")
	if s.ContainsSet(other) {
		t.Error("ContainsSet of a set reaching past s")
	}
}

// TestGTIDSetEncode checks the binary form against MySQL's layout
// (Gtid_set::encode): count, then per source its uuid, interval count and
// [start, end) pairs, little-endian.
func TestGTIDSetEncode(t *testing.T) {
	s, _ := ParseGTIDSet(uuidA + ":1-5:11," + uuidB + ":3")
	var want []byte
	want = binary.LittleEndian.AppendUint64(want, 2)
	a := mustSID(t, uuidA)
	want = append(want, a[:]...)
	want = binary.LittleEndian.AppendUint64(want, 2)
	for _, v := range []uint64{1, 6, 11, 12} {
		want = binary.LittleEndian.AppendUint64(want, v)
	}
	b := mustSID(t, uuidB)
	want = append(want, b[:]...)
	want = binary.LittleEndian.AppendUint64(want, 1)
	want = binary.LittleEndian.AppendUint64(want, 3)
	want = binary.LittleEndian.AppendUint64(want, 4)
	if got := s.Encode(); !bytes.Equal(got, want) {
		t.Fatalf("Encode:\n%x\nwant\n%x", got, want)
	}
	back, err := DecodeGTIDSet(want)
	if err != nil || back.String() != s.String() {
		t.Fatalf("DecodeGTIDSet: %s, %v", back, err)
	}
	if got := (GTIDSet{}).Encode(); !bytes.Equal(got, make([]byte, 8)) {
		t.Errorf("the empty set encodes as %x", got)
	}

	for name, in := range map[string][]byte{
		"truncated":      want[:len(want)-1],
		"left over":      append(append([]byte{}, want...), 0),
		"empty":          nil,
		"huge count":     binary.LittleEndian.AppendUint64(nil, 1<<40),
		"end <= start":   append(append(binary.LittleEndian.AppendUint64(nil, 1), a[:]...), append(binary.LittleEndian.AppendUint64(nil, 1), append(binary.LittleEndian.AppendUint64(nil, 5), binary.LittleEndian.AppendUint64(nil, 5)...)...)...),
		"zero start":     append(append(binary.LittleEndian.AppendUint64(nil, 1), a[:]...), append(binary.LittleEndian.AppendUint64(nil, 1), append(binary.LittleEndian.AppendUint64(nil, 0), binary.LittleEndian.AppendUint64(nil, 5)...)...)...),
		"many intervals": append(append(binary.LittleEndian.AppendUint64(nil, 1), a[:]...), binary.LittleEndian.AppendUint64(nil, 1<<50)...),
	} {
		if _, err := DecodeGTIDSet(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	tagged := binary.LittleEndian.AppendUint64(nil, 1<<56|1)
	if _, err := DecodeGTIDSet(tagged); !errors.Is(err, ErrUnsupported) {
		t.Errorf("tagged format: %v, want ErrUnsupported", err)
	}
}

// FuzzGTIDSet checks that what ParseGTIDSet accepts prints back to
// itself, encodes and decodes to itself, and contains its intervals' ends;
// and that DecodeGTIDSet never panics on any bytes.
func FuzzGTIDSet(f *testing.F) {
	for _, s := range []string{"", uuidA + ":1-5:11-18," + uuidB + ":1", uuidA + ":1-9223372036854775806", uuidA + ":3:1:2", uuidA + ":t:1"} {
		f.Add(s, []byte(nil))
	}
	s, _ := ParseGTIDSet(uuidA + ":1-5:11-18," + uuidB + ":1")
	f.Add("", s.Encode())
	f.Fuzz(func(t *testing.T, text string, bin []byte) {
		if d, err := DecodeGTIDSet(bin); err == nil {
			if e := d.Encode(); len(e) > len(bin) {
				t.Fatalf("decoded %x into %s, which encodes longer: %x", bin, d, e)
			}
		}
		set, err := ParseGTIDSet(text)
		if err != nil {
			return
		}
		again, err := ParseGTIDSet(set.String())
		if err != nil || again.String() != set.String() {
			t.Fatalf("%q -> %q -> %q, %v", text, set, again, err)
		}
		dec, err := DecodeGTIDSet(set.Encode())
		if err != nil || dec.String() != set.String() {
			t.Fatalf("%s encoded and decoded: %s, %v", set, dec, err)
		}
		for _, sid := range set.SIDs() {
			for _, iv := range set.Intervals(sid) {
				if !set.Contains(sid, iv.Start) || !set.Contains(sid, iv.End) || set.Contains(sid, iv.End+1) || set.Contains(sid, iv.Start-1) {
					t.Fatalf("%s: Contains wrong around %s:%d-%d", set, sid, iv.Start, iv.End)
				}
			}
		}
		if !set.ContainsSet(set) || !set.ContainsSet(again) {
			t.Fatalf("%s does not contain itself", set)
		}
	})
}
