package failgroup

import (
	"testing"
	"time"
)

func TestNormalize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`idem: handling order.order.placed.v1 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b: permanent: field "qty" is -3`,
			`idem: handling order.order.placed.v1 <uuid>: permanent: field <q> is <n>`},
		{`product 'p-blocked' is blocked by the warehouse`, `product <q> is blocked by the warehouse`},
		{`can't reserve: aggregate's stock is 0`, `can't reserve: aggregate's stock is <n>`},
		{`seq 1042 at 2026-12-02T08:00:00.123456Z after 1.5s`, `seq <n> at <time> after <dur>`},
		{`at 2026-12-02 08:00:00 UTC, 10:11:12`, `at <time>, <time>`},
		{`tx 0x1f2e deadbeef01 and 1f2e3d4c5b6a`, `tx <hex> <hex> and <hex>`},
		{`customer o12 v1 E42 p-42 c_7`, `customer o12 v1 E42 p-<n> c_7`},
		{"connect 127.0.0.1:5432:\n\t  refused", `connect <n>:<n>: refused`},
		{`deadbeef is not hex with a digit`, `deadbeef is not hex with a digit`},
		{`"unterminated`, `"unterminated`},
		{`escaped "a \"b\" c" end`, `escaped <q> end`},
	} {
		if got := Normalize(tc.in); got != tc.want {
			t.Errorf("Normalize(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

func TestCounter(t *testing.T) {
	var c Counter
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	a := c.Add("stock", ClassPermanent, `event 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b: field "qty" is -3`, t0, t0)
	b := c.Add("stock", ClassPermanent, `event 0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b: field "qty" is -7`, t0.Add(time.Hour), t0.Add(2*time.Hour))
	other := c.Add("stock", ClassPermanent, `unknown product`, t0, t0)
	billing := c.Add("billing", ClassPermanent, `event 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b: field "qty" is -3`, t0, t0)
	exhausted := c.Add("stock", ClassExhausted, `event 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b: field "qty" is -3`, t0, t0)
	if a != b {
		t.Errorf("messages that differ by ids and numbers in two groups: %s, %s", a, b)
	}
	if a == other || a == billing || a == exhausted || !ValidID(a) {
		t.Errorf("groups %s %s %s %s: want a valid id, distinct per cause, consumer and class", a, other, billing, exhausted)
	}
	gs := c.Groups()
	if len(gs) != 4 || gs[0].ID != a || gs[0].Count != 2 || !gs[0].FirstSeen.Equal(t0) || !gs[0].LastSeen.Equal(t0.Add(2*time.Hour)) ||
		gs[0].Example != `event 0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b: field "qty" is -7` {
		t.Errorf("groups %+v", gs)
	}
	if ID("stock", ClassPermanent, gs[0].Cause) != a {
		t.Error("ID is not stable")
	}
}

func TestClasses(t *testing.T) {
	for _, tc := range []struct {
		err    string
		heldBy int64
		want   string
	}{
		{"idem: undecodable message: body is not JSON", 0, ClassUndecodable},
		{"idem: handling x.y.z.v1 id: permanent: unknown product", 0, ClassPermanent},
		{"idem: handling x.y.z.v1 id: warehouse locked", 0, ClassExhausted},
		{"idem: held behind parked message 3 of aggregate order 42", 3, ClassHeld},
	} {
		if got := ConsumerClass(tc.err, tc.heldBy); got != tc.want {
			t.Errorf("ConsumerClass(%q, %d) = %s, want %s", tc.err, tc.heldBy, got, tc.want)
		}
	}
	if RelayClass("refused by the broker on 3 attempts; last: unroutable") != ClassRefused ||
		RelayClass(`idem: outbox row seq 4 cannot be published: id "" is empty`) != ClassUnreadable || RelayClass("x") != ClassOther {
		t.Error("RelayClass")
	}
}

func TestHeldCause(t *testing.T) {
	a := HeldCause("idem: held behind parked message 17 of aggregate order cust-abc, which is retried or removed first", "cust-abc")
	b := HeldCause("idem: held behind parked message 4 of aggregate order o12, which is retried or removed first", "o12")
	if a != b || a != "idem: held behind parked message <n> of aggregate order <id>, which is retried or removed first" {
		t.Errorf("held causes %q, %q", a, b)
	}
}

// TestExampleOnATie: failures at the same instant keep the first counted as
// the example (the newest, as the store lists them), whatever follows.
func TestExampleOnATie(t *testing.T) {
	at := time.Date(2026, 12, 4, 8, 0, 0, 0, time.UTC)
	var c Counter
	c.Add("stock", "permanent", `field "qty" is -11`, at, at)
	c.Add("stock", "permanent", `field "qty" is -7`, at, at)
	c.Add("stock", "permanent", `field "qty" is -3`, at.Add(-time.Second), at.Add(-time.Second))
	g := c.Groups()
	if len(g) != 1 || g[0].Count != 3 || g[0].Example != `field "qty" is -11` {
		t.Errorf("groups %+v, want one of 3 with the first counted as its example", g)
	}
	c.Add("stock", "permanent", `field "qty" is -2`, at.Add(time.Second), at.Add(time.Second))
	if g := c.Groups(); g[0].Example != `field "qty" is -2` {
		t.Errorf("example %q, want the later failure's", g[0].Example)
	}
}
