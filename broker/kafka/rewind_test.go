package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/testsvc"
)

// TestRewind: a group that read twenty records, ten before a time and ten
// after, is refused a rewind while its subscriber runs; stopped, it is
// rewound to that time (and a later rewind moves nothing forward), and its
// next subscriber reads the ten later records again, and not the earlier
// ones, to the end of every partition.
func TestRewind(t *testing.T) {
	t.Parallel()
	topic := "outbox.event.test" // brokertest.NewMessage's aggregate type
	c := newCluster(t, 3, topic)
	pub := newPublisher(t, c)
	var before, after []idem.Message
	for i := range 10 {
		before = append(before, brokertest.NewMessage(t, "order.order.placed.v1", fmt.Sprint("k", i), i))
	}
	brokertest.Publish(t, pub, before...)
	// The time to rewind to: a millisecond after the first ten records'.
	to := time.UnixMilli(time.Now().UnixMilli() + 1)
	testsvc.WaitFor(t, 10*time.Second, "the clock past the rewind's time", func() bool { return !time.Now().Before(to) })
	for i := range 10 {
		after = append(after, brokertest.NewMessage(t, "order.order.placed.v1", fmt.Sprint("k", i), 10+i))
	}
	brokertest.Publish(t, pub, after...)

	var mu sync.Mutex
	seen := map[string]int{}
	deliver := func(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		mu.Lock()
		defer mu.Unlock()
		disps := make([]broker.Disposition, len(ds))
		for i, d := range ds {
			seen[d.Message.EventID.String()]++
			disps[i].Action = broker.Ack
		}
		return disps, make([]error, len(ds))
	}
	caughtUp := func() bool {
		stats, err := pub.Inspect(context.Background(), []string{"stock"})
		return err == nil && len(stats) == 1 && stats[0].Lag == 0
	}
	sub := newSubscriber(t, c, "stock", []string{topic}, deliver)
	stop := testsvc.Start(t, sub)
	testsvc.WaitFor(t, 30*time.Second, "the twenty records read and committed", caughtUp)

	ctx := testsvc.Ctx(t, 30*time.Second)
	if _, err := pub.Rewind(ctx, "stock", to); err == nil || !strings.Contains(err.Error(), "stop consumer stock's subscribers first") {
		t.Fatalf("rewind of a group with a member: err = %v, want a refusal", err)
	}
	stop()
	n, err := pub.Rewind(ctx, "stock", to)
	if err != nil {
		t.Fatalf("rewind: %v", err)
	}
	if n == 0 || n > 3 {
		t.Errorf("rewound %d partitions, want 1 to 3", n)
	}
	// Never forward: to a later time, or to the same again, nothing moves.
	for _, later := range []time.Time{to, to.Add(time.Hour)} {
		if n, err := pub.Rewind(ctx, "stock", later); err != nil || n != 0 {
			t.Errorf("rewind to %s after the rewind to %s: %d partitions moved, %v; want none", later, to, n, err)
		}
	}
	if _, err := pub.Rewind(ctx, "nobody", to); err == nil {
		t.Error("rewind of a group that does not exist succeeded, want an error")
	}

	testsvc.Start(t, newSubscriber(t, c, "stock", []string{topic}, deliver))
	testsvc.WaitFor(t, 30*time.Second, "the later records read again", caughtUp)
	mu.Lock()
	defer mu.Unlock()
	for _, m := range before {
		if got := seen[m.EventID.String()]; got != 1 {
			t.Errorf("record %s, before the rewind's time, read %d times, want 1", m.Key, got)
		}
	}
	for _, m := range after {
		if got := seen[m.EventID.String()]; got != 2 {
			t.Errorf("record %s, after the rewind's time, read %d times, want 2", m.Key, got)
		}
	}
}
