package mysql8test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"vitess.io/vitess/go/mysql/binlog"

	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/internal/mysqlrepl/binlogtest"
)

// genDoc builds a JSON document from r: objects, arrays, strings with
// escapes and non-ASCII, integers of every width, doubles, literals,
// DATETIME and DATE values, up to depth levels.
func genDoc(r *rand.Rand, depth int) any {
	n := r.IntN(11)
	if depth <= 0 {
		n = r.IntN(8)
	}
	switch n {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2:
		return int(r.Int64N(1<<16)) - 1<<15
	case 3:
		return int(r.Int64()) - 1<<62
	case 4:
		return r.Uint64()
	case 5:
		return math.Float64frombits(r.Uint64()&^(0x7ff<<52)) + float64(r.IntN(1000)) // finite
	case 6:
		return []string{"", "a", "quote\" back\\slash", "tab\tnl\n\x01", "ünïcode 😀", "/slash"}[r.IntN(6)]
	case 7:
		y, mo, d := int64(1000+r.IntN(9000)), int64(1+r.IntN(12)), int64(1+r.IntN(28))
		if r.IntN(2) == 0 {
			return binlogtest.Opaque{Type: binlog.TypeDate, Data: binlogtest.PackedDateTime(y, mo, d, 0, 0, 0, 0)}
		}
		return binlogtest.Opaque{Type: binlog.TypeDateTime, Data: binlogtest.PackedDateTime(y, mo, d, int64(r.IntN(24)), int64(r.IntN(60)), int64(r.IntN(60)), int64(r.IntN(1000000)))}
	case 8, 9:
		var a []any
		for range r.IntN(6) {
			a = append(a, genDoc(r, depth-1))
		}
		return a
	}
	// Keys sorted as MySQL stores them: by length, then bytes.
	var o binlogtest.Object
	for i := range r.IntN(6) {
		o = append(o, [2]any{fmt.Sprintf("k%d", i), genDoc(r, depth-1)})
	}
	return o
}

// checkAgainstVitess decodes doc with mysqlrepl and with vitess's
// independent decoder (binlog.ParseBinaryJSON): the same value, and
// mysqlrepl's text is valid JSON.
func checkAgainstVitess(t *testing.T, doc []byte) {
	t.Helper()
	mine, err := mysqlrepl.DecodeJSON(doc)
	if err != nil {
		t.Fatalf("%x: %v", doc, err)
	}
	v, err := binlog.ParseBinaryJSON(doc)
	if err != nil {
		t.Fatalf("vitess: %x: %v", doc, err)
	}
	theirs := v.MarshalTo(nil)
	if !json.Valid(mine) || !sameJSON(t, mine, theirs) {
		t.Fatalf("%x:\nmysqlrepl %s\nvitess    %s", doc, mine, theirs)
	}
}

// TestJSONAgainstVitess decodes 3,000 generated documents, in MySQL's
// small and large formats.
func TestJSONAgainstVitess(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 1500 {
		d := genDoc(r, 4)
		checkAgainstVitess(t, binlogtest.JSON(d, false))
		checkAgainstVitess(t, binlogtest.JSON(d, true))
	}
}

// FuzzJSONAgainstVitess generates documents from fuzzed seeds.
func FuzzJSONAgainstVitess(f *testing.F) {
	f.Add(uint64(1), uint64(2), false)
	f.Fuzz(func(t *testing.T, a, b uint64, large bool) {
		checkAgainstVitess(t, binlogtest.JSON(genDoc(rand.New(rand.NewPCG(a, b)), 5), large))
	})
}
