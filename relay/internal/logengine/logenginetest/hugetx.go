package logenginetest

import (
	"context"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/testsvc"
)

// HugeRows is the size of the transaction of HugeTransaction: enough that
// holding it whole takes several times the bound (about 3 KB a row between
// the decoded row and its message, under the race detector), small enough
// for a test. docs/PERFORMANCE.md records a million.
const HugeRows = 200_000

// HugeHeapBound is the live heap the relay may reach relaying it.
const HugeHeapBound = 128 << 20

// HugeTransaction checks that one transaction of HugeRows outbox rows (a
// backfill), written by insert (aggregate ids "0" to "99", versions rising
// with the row's number), is relayed whole by the relay newRelay returns,
// each aggregate's events in order, every row deleted and archived, with
// the process's live heap under HugeHeapBound: the relay hands the
// transaction on in parts instead of holding it. Not parallel: the heap
// sampled is the test process's. left counts the outbox's rows.
func HugeTransaction(t *testing.T, newRelay func(pub broker.Publisher) Relay, insert func(), left func() int) {
	pub := &orderCounter{last: map[string]int64{}}
	r := newRelay(pub)
	Start(t, r)
	Eventually(t, "the relay streaming", func() bool { return r.Stats().Streaming })
	insert()
	stop := heapPeak()
	testsvc.WaitFor(t, 10*time.Minute, "the transaction's rows published, deleted and archived", func() bool {
		s := r.Stats()
		return pub.count() >= HugeRows && s.Deleted >= HugeRows && s.Archived >= HugeRows
	})
	peak := stop()
	s := r.Stats()
	t.Logf("%d rows: live heap peak %d MB; published %d, deleted %d, archived %d, transactions %d", HugeRows, peak>>20,
		s.Published, s.Deleted, s.Archived, s.Transactions)
	if n := pub.count(); n != HugeRows {
		t.Errorf("%d messages published, want %d", n, HugeRows)
	}
	if len(pub.wrong) > 0 {
		t.Errorf("out of order or unreadable: %q", pub.wrong)
	}
	if n := left(); n != 0 {
		t.Errorf("%d rows left in the outbox", n)
	}
	if s.Transactions != 1 {
		t.Errorf("Stats.Transactions = %d, want 1", s.Transactions)
	}
	if peak > HugeHeapBound {
		t.Errorf("the relay's live heap reached %d MB relaying one transaction of %d rows, want under %d MB", peak>>20, HugeRows, HugeHeapBound>>20)
	}
}

// orderCounter is a publisher that keeps no message: it counts them and
// checks that each aggregate's versions rise.
type orderCounter struct {
	mu    sync.Mutex
	n     int
	last  map[string]int64
	wrong []string
}

// Publish implements broker.Publisher.
func (c *orderCounter) Publish(_ context.Context, msgs []idem.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		ev, err := idem.Decode(m)
		switch {
		case err != nil:
			c.wrong = append(c.wrong, err.Error())
			continue
		case ev.AggregateVersion <= c.last[ev.AggregateID] && len(c.wrong) < 10:
			c.wrong = append(c.wrong, ev.AggregateID+": a version after a later one")
		}
		c.last[ev.AggregateID] = ev.AggregateVersion
		c.n++
	}
	return nil
}

func (c *orderCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// heapPeak samples the heap's live objects every 20ms until the function
// it returns is called, which returns the highest sample.
func heapPeak() func() uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak uint64
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(sample)
			peak = max(peak, sample[0].Value.Uint64())
			select {
			case <-t.C:
			case <-done:
				return
			}
		}
	}()
	return func() uint64 { close(done); <-ended; return peak }
}
