package amqp_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/testsvc"
)

// TestPublishToPartitionedConsumer: PublishToConsumer to a partitioned
// consumer, which has partition queues and no queue of its name, puts each
// message in the partition queue of its key's bucket, where the other
// messages of its aggregate are, and each once; to a consumer without any
// queue it fails with broker.ErrUnroutable and publishes nothing.
func TestPublishToPartitionedConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const p = 4
	declarePartitioned(t, b.url, b.exchange, b.queue, p)
	consumer := b.exchange // amqp.QueueName(consumer) is b.queue
	var msgs []idem.Message
	var ids []string
	for i := range 40 {
		m := brokertest.NewMessage(t, replicaName, fmt.Sprintf("agg-%d", i), 1)
		msgs, ids = append(msgs, m), append(ids, m.EventID.String())
	}
	ctx := testsvc.Ctx(t, time.Minute)
	if err := b.pub.PublishToConsumer(ctx, consumer, msgs); err != nil {
		t.Fatalf("PublishToConsumer: %v", err)
	}
	d := drainPartitions(t, b.url, b.queue, p)
	for key, q := range d.queueOf {
		if want := amqp.PartitionQueue(b.queue, amqp.Bucket([]byte(key))%p); q != want {
			t.Errorf("aggregate %q went to %s, want %s", key, q, want)
		}
	}
	slices.Sort(ids)
	slices.Sort(d.ids)
	if !slices.Equal(d.ids, ids) {
		t.Errorf("the partition queues hold %d messages, want the %d published, once each", len(d.ids), len(ids))
	}

	err := b.pub.PublishToConsumer(ctx, consumer+"-nobody", msgs[:1])
	if !errors.Is(err, broker.ErrUnroutable) {
		t.Errorf("PublishToConsumer to a consumer without a queue: err = %v, want broker.ErrUnroutable", err)
	}
}
