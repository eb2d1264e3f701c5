package amqp_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testsvc"
)

// declarePartitioned declares the topology of queue split into p partitions,
// as a partitioned subscriber does when it starts, and stops consuming.
func declarePartitioned(t testing.TB, url, exchange, queue string, p int) {
	t.Helper()
	cfg := subscriberConfig(url, exchange, queue, "#")
	cfg.Partitions, cfg.Logger = p, quiet
	sub := newSubscriber(t, cfg, func(context.Context, []broker.Delivery) ([]broker.Disposition, []error) {
		t.Error("delivery while declaring")
		return nil, nil
	})
	ctx := testsvc.Ctx(t, time.Minute)
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sub.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// drained is what drainPartitions took from partition queues.
type drained struct {
	queueOf map[string]string   // partition queue by key
	keys    map[string][]string // keys by partition queue, in queue order
	ids     []string            // every event id taken
}

// drainPartitions takes (basic.get, auto-ack) every message waiting in the
// partition queues 0 to n-1 of queue. An aggregate found in two partition
// queues fails the test.
func drainPartitions(t *testing.T, url, queue string, n int) drained {
	t.Helper()
	d := drained{queueOf: map[string]string{}, keys: map[string][]string{}}
	withChannel(t, url, func(ch *amqp091.Channel) {
		for k := range n {
			q := amqp.PartitionQueue(queue, k)
			for {
				m, ok, err := ch.Get(q, true)
				if err != nil {
					t.Fatalf("get from %s: %v", q, err)
				}
				if !ok {
					break
				}
				key, _ := m.Headers[amqp.HeaderKey].(string)
				if prev, ok := d.queueOf[key]; ok && prev != q {
					t.Errorf("aggregate %q in %s and %s", key, prev, q)
				}
				d.queueOf[key] = q
				d.keys[q] = append(d.keys[q], key)
				d.ids = append(d.ids, m.MessageId)
			}
		}
	})
	return d
}

// TestPartitionMappingSurvivesNodeRestart: the partition queue an aggregate's
// events go to does not change when the RabbitMQ node restarts (the
// x-consistent-hash exchange of earlier versions moved 345 of 400 keys with
// 8 partitions). A private one-node cluster, restarted between two rounds
// of the same 400 keys.
func TestPartitionMappingSurvivesNodeRestart(t *testing.T) {
	t.Parallel()
	c := testamqp.StartCluster(t, 1)
	url := c.NodeURL(0)
	const p, keys = 8, 400
	exchange := testamqp.Name("idem_t_")
	queue := exchange + ".events"
	declarePartitioned(t, url, exchange, queue, p)

	round := func(v int) drained {
		t.Helper()
		pub := newPublisher(t, url, exchange)
		msgs := make([]idem.Message, keys)
		for i := range msgs {
			msgs[i] = brokertest.NewMessage(t, replicaName, fmt.Sprintf("agg-%d", i), v)
		}
		brokertest.Publish(t, pub, msgs...)
		_ = pub.Close()
		d := drainPartitions(t, url, queue, p)
		if len(d.ids) != keys || len(d.queueOf) != keys {
			t.Fatalf("round %d: %d messages of %d keys in the partition queues, want %d of %d", v, len(d.ids), len(d.queueOf), keys, keys)
		}
		return d
	}
	before := round(1)
	c.Restart(t, 0)
	after := round(2)

	moved := 0
	for key, q := range before.queueOf {
		if after.queueOf[key] != q {
			moved++
		}
		if want := amqp.PartitionQueue(queue, amqp.Bucket([]byte(key))%p); q != want {
			t.Errorf("aggregate %q went to %s, want %s (bucket %d mod %d)", key, q, want, amqp.Bucket([]byte(key)), p)
		}
	}
	if moved > 0 {
		t.Errorf("%d of %d aggregates went to another partition queue after the restart", moved, keys)
	}
	if len(before.keys) != p {
		t.Errorf("partition queues used: %d, want all %d", len(before.keys), p)
	}
}

// TestPartitionMessageWithoutBucket: messages that carry no bucket header
// (published by something other than idem's Publisher) are not lost: they
// all land in partition 0's queue, in their order, and nothing else.
func TestPartitionMessageWithoutBucket(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const p = 4
	declarePartitioned(t, b.url, b.exchange, b.queue, p)
	var ids []string
	withChannel(t, b.url, func(ch *amqp091.Channel) {
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		for i := range 40 {
			m := brokertest.NewMessage(t, replicaName, fmt.Sprintf("agg-%d", i), 1)
			ids = append(ids, m.EventID.String())
			conf, err := ch.PublishWithDeferredConfirmWithContext(testsvc.Ctx(t, time.Minute), b.exchange, replicaName, true, false,
				amqp091.Publishing{MessageId: m.EventID.String(), Type: m.EventName, Body: m.Body,
					Headers: amqp091.Table{amqp.HeaderKey: string(m.Key)}})
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := conf.WaitContext(testsvc.Ctx(t, time.Minute)); !ok || err != nil {
				t.Fatalf("publish %d: acked %v, %v", i, ok, err)
			}
		}
	})
	d := drainPartitions(t, b.url, b.queue, p)
	if p0 := amqp.PartitionQueue(b.queue, 0); len(d.keys) != 1 || len(d.keys[p0]) != len(ids) {
		t.Fatalf("messages by partition queue: %v; want all %d in %s", d.keys, len(ids), p0)
	}
	if !slices.Equal(d.ids, ids) {
		t.Errorf("partition 0 holds %v, want %v (publishing order)", d.ids, ids)
	}
}

// TestPartitionCountChange: a subscriber started with another partition
// count deletes the old count's partition exchange (and the consistent-hash
// exchange of earlier versions), so that a message goes
// to one partition queue only (no copy routed by the old mapping), by the
// new mapping.
func TestPartitionCountChange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	declarePartitioned(t, b.url, b.exchange, b.queue, 4)
	// A stand-in for the consistent-hash exchange of earlier versions (a
	// fanout: the test does not need the plugin), bound to partition 1.
	legacy := b.queue + ".hash"
	withChannel(t, b.url, func(ch *amqp091.Channel) {
		for _, err := range []error{
			ch.ExchangeDeclare(legacy, "fanout", true, false, false, false, nil),
			ch.ExchangeBind(legacy, "#", b.exchange, false, nil),
			ch.QueueBind(amqp.PartitionQueue(b.queue, 1), "", legacy, false, nil),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
	})
	declarePartitioned(t, b.url, b.exchange, b.queue, 2)
	msgs := versions(t, 100, 1)
	brokertest.Publish(t, b.pub, msgs...)
	d := drainPartitions(t, b.url, b.queue, 4)
	if len(d.ids) != len(msgs) {
		t.Fatalf("%d messages in the partition queues, want %d (each once)", len(d.ids), len(msgs))
	}
	for key, q := range d.queueOf {
		if want := amqp.PartitionQueue(b.queue, amqp.Bucket([]byte(key))%2); q != want {
			t.Errorf("aggregate %q went to %s, want %s", key, q, want)
		}
	}
	for _, x := range []string{amqp.PartitionExchange(b.queue, 4), legacy} {
		withChannel(t, b.url, func(ch *amqp091.Channel) {
			err := ch.ExchangeDeclarePassive(x, "headers", true, false, false, false, nil)
			var ae *amqp091.Error
			if !errors.As(err, &ae) || ae.Code != amqp091.NotFound {
				t.Errorf("exchange %s after starting with 2 partitions: %v, want NOT_FOUND", x, err)
			}
		})
	}
}

// BenchmarkPartitionPublishCost measures what a partitioned consumer's
// headers exchange costs the publisher: messages/s through amqp.Publisher
// into a consumer split into 8 partitions, into one partition (the headers
// exchange in front of a single queue) and into an unpartitioned one, in
// turn, b.N rounds (e.g. -benchtime 5x) of 20000 messages each, and
// reports the medians:
//
//	go test -run '^$' -bench BenchmarkPartitionPublishCost -benchtime 5x ./broker/amqp/
func BenchmarkPartitionPublishCost(b *testing.B) {
	var t testing.TB = b
	runs := b.N
	url := testamqp.URL(t)
	const n, batch, senders = 20000, 100, 4
	rate := func(p int) float64 {
		exchange := testamqp.Name("idem_t_")
		queue := exchange + ".events"
		if p > 0 {
			declarePartitioned(t, url, exchange, queue, p)
		} else {
			declare(t, url, exchange, []string{queue}, []string{"#"})
		}
		pub := newPublisher(t, url, exchange)
		defer pub.Close()
		msgs := make([]idem.Message, n)
		for i := range msgs {
			msgs[i] = brokertest.NewMessage(t, replicaName, fmt.Sprintf("agg-%d", i%1000), i/1000)
		}
		ctx := testsvc.Ctx(t, 5*time.Minute)
		start := time.Now()
		errs := make(chan error, senders)
		for s := range senders {
			go func() {
				var err error
				for i := s * batch; i < n && err == nil; i += senders * batch {
					err = pub.Publish(ctx, msgs[i:min(i+batch, n)])
				}
				errs <- err
			}()
		}
		for range senders {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		r := float64(n) / time.Since(start).Seconds()
		withChannel(t, url, func(ch *amqp091.Channel) {
			qs := []string{queue}
			if p > 0 {
				qs = qs[:0]
				for k := range p {
					qs = append(qs, amqp.PartitionQueue(queue, k))
				}
			}
			total := 0
			for _, q := range qs {
				m, err := ch.QueueDelete(q, false, false, false)
				if err != nil {
					t.Fatal(err)
				}
				total += m
			}
			if total != n {
				t.Fatalf("%d messages in the queues, want %d", total, n)
			}
			for _, x := range []string{exchange, amqp.PartitionExchange(queue, p), amqp.NoBucketExchange(queue)} {
				_ = ch.ExchangeDelete(x, false, false)
			}
		})
		return r
	}
	// Unpartitioned, one partition (the headers exchange's cost alone: same
	// single queue) and 8 partitions, in a rotating order.
	counts := []int{0, 1, 8}
	rates := map[int][]float64{}
	for i := range runs {
		for j := range counts {
			p := counts[(i+j)%len(counts)]
			rates[p] = append(rates[p], rate(p))
		}
	}
	med := func(xs []float64) float64 { xs = slices.Clone(xs); sort.Float64s(xs); return xs[len(xs)/2] }
	for _, p := range counts {
		b.ReportMetric(med(rates[p]), fmt.Sprintf("msg/s-p%d", p))
		t.Logf("partitions %d: median %.0f msg/s (%.2f of unpartitioned), runs %.0f", p, med(rates[p]), med(rates[p])/med(rates[0]), rates[p])
	}
}
