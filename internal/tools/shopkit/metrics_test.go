package shopkit_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/tools/shopkit"
)

// TestParseMetrics: each metric's samples are summed over their labels,
// braces inside label values included.
func TestParseMetrics(t *testing.T) {
	t.Parallel()
	m, err := shopkit.ParseMetrics(strings.NewReader(`# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
idem_relay_published_total{table="shop_order.outbox"} 40
idem_relay_published_total{table="shop_stock.outbox",x="a}b"} 2.5e1
idem_relay_published_totalx 7
`))
	if err != nil {
		t.Fatal(err)
	}
	if m["process_cpu_seconds_total"] != 12.5 || m["idem_relay_published_total"] != 65 || m["idem_relay_published_totalx"] != 7 {
		t.Fatalf("parsed %v", m)
	}
}
