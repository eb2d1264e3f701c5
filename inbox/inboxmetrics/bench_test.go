package inboxmetrics_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxmetrics"
)

// BenchmarkObserver is what the metrics cost a consumer per event, CPU
// only: one Settled (an applied event: its counter and its delay) and one
// Handled, plus a Batch per 100 events, as ProcessBatch(100) calls them.
// The database work around them (a transaction, a marker) takes hundreds
// of microseconds.
//
// Run: go test -run '^$' -bench BenchmarkObserver ./inbox/inboxmetrics/
func BenchmarkObserver(b *testing.B) {
	obs := inboxmetrics.New("stock", inboxmetrics.Options{}).Observer()
	ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]string{"order_id": "42"})
	if err != nil {
		b.Fatal(err)
	}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if i%100 == 0 {
				obs.Batch(100)
			}
			i++
			obs.Handled(300 * time.Microsecond)
			obs.Settled(inbox.Settlement{Outcome: inbox.Applied, Event: ev, At: time.Now()})
		}
	})
}
