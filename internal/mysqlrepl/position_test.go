package mysqlrepl

import (
	"reflect"
	"testing"
)

func TestPosition(t *testing.T) {
	p, err := ParsePosition("2-7-5, 0-1-100 ,10-3-1")
	if err != nil {
		t.Fatal(err)
	}
	if s := p.String(); s != "0-1-100,2-7-5,10-3-1" {
		t.Errorf("String %q", s)
	}
	if !p.Contains(GTID{0, 9, 100}) || !p.Contains(GTID{0, 1, 1}) || p.Contains(GTID{0, 1, 101}) || p.Contains(GTID{1, 1, 1}) {
		t.Error("Contains")
	}
	q := p
	q.Update(GTID{0, 2, 200})
	q.Update(GTID{5, 5, 5})
	if p.String() != "0-1-100,2-7-5,10-3-1" {
		t.Errorf("Update changed the copy's original: %s", p)
	}
	if q.String() != "0-2-200,2-7-5,5-5-5,10-3-1" {
		t.Errorf("after Update: %s", q)
	}
	if g, ok := q.Get(5); !ok || g != (GTID{5, 5, 5}) {
		t.Errorf("Get(5) = %v %v", g, ok)
	}
	if !reflect.DeepEqual(q.GTIDs(), []GTID{{0, 2, 200}, {2, 7, 5}, {5, 5, 5}, {10, 3, 1}}) {
		t.Errorf("GTIDs %v", q.GTIDs())
	}

	var zero Position
	if zero.String() != "" || !zero.IsZero() || zero.Contains(GTID{}) {
		t.Error("zero position")
	}
	if e, err := ParsePosition(""); err != nil || !e.IsZero() {
		t.Errorf("empty: %v %v", e, err)
	}
	if e, err := ParsePosition("4294967295-4294967295-18446744073709551615"); err != nil || e.String() != "4294967295-4294967295-18446744073709551615" {
		t.Errorf("max: %v %v", e, err)
	}
	for _, bad := range []string{"0-1", "0-1-2-3", "a-1-2", "0-1-2,", ",0-1-2", "0-1-2,0-3-4", "-1-1-1", "+1-1-1", "0-1-18446744073709551616", "4294967296-1-1", "0 -1-2"} {
		if _, err := ParsePosition(bad); err == nil {
			t.Errorf("ParsePosition(%q): no error", bad)
		}
	}
}
