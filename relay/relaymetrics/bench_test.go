package relaymetrics_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/relaymetrics"
)

// BenchmarkHooks is what the metrics cost a relay per published row, CPU
// only: its commit-to-publish delay, and the claim, publish and mark
// durations of its batch shared by the batch's 1,000 rows. Claiming,
// publishing and marking a row take tens of microseconds.
//
// Run: go test -run '^$' -bench BenchmarkHooks ./relay/relaymetrics/
func BenchmarkHooks(b *testing.B) {
	cfg := relaymetrics.New().Instrument(relay.Config{})
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if i%1000 == 0 {
				cfg.Observer.Claim(3 * time.Millisecond)
				cfg.Observer.Publish(5 * time.Millisecond)
				cfg.Observer.Mark(4 * time.Millisecond)
			}
			i++
			cfg.Observer.Delay(20 * time.Millisecond)
		}
	})
}
