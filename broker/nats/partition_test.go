package nats_test

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/internal/testsvc"
)

// TestPartitionCountMismatch: the stream records its partition count; a
// publisher or subscriber configured with another fails with
// ErrPartitions, whichever came first.
func TestPartitionCountMismatch(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := func(stream nats.StreamConfig) error {
		sub, err := nats.NewSubscriber(nats.SubscriberConfig{ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: stream, Consumer: "stock"},
			func(context.Context, []broker.Delivery) ([]broker.Disposition, []error) { return nil, nil })
		if err != nil {
			t.Fatal(err)
		}
		if err := sub.Start(ctx); err != nil {
			return err
		}
		return sub.Stop(ctx)
	}
	publish := func(stream nats.StreamConfig) error {
		p, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: stream})
		if err == nil {
			_ = p.Close()
		}
		return err
	}
	with := func(s nats.StreamConfig, p int) nats.StreamConfig { s.Partitions = p; return s }

	// A partitioned stream, created by a publisher.
	four := newNames().stream
	four.Partitions = 4
	if err := publish(four); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		err  error
	}{
		{"publisher with 2 partitions", publish(with(four, 2))},
		{"unpartitioned publisher", publish(with(four, 0))},
		{"subscriber with 2 partitions", start(with(four, 2))},
		{"unpartitioned subscriber", start(with(four, 0))},
	} {
		if !errors.Is(c.err, nats.ErrPartitions) {
			t.Errorf("%s on a stream of 4 partitions: %v, want ErrPartitions", c.what, c.err)
		}
	}
	if err := start(four); err != nil {
		t.Errorf("subscriber with 4 partitions: %v", err)
	}

	// An unpartitioned stream, created by a subscriber.
	zero := newNames().stream
	if err := start(zero); err != nil {
		t.Fatal(err)
	}
	if err := publish(with(zero, 4)); !errors.Is(err, nats.ErrPartitions) {
		t.Errorf("publisher with 4 partitions on an unpartitioned stream: %v, want ErrPartitions", err)
	}
	if err := start(with(zero, 4)); !errors.Is(err, nats.ErrPartitions) {
		t.Errorf("subscriber with 4 partitions on an unpartitioned stream: %v, want ErrPartitions", err)
	}
	if err := publish(zero); err != nil {
		t.Errorf("unpartitioned publisher: %v", err)
	}

	// Repartition changes the count of a drained stream.
	pub := newPublisher(t, srv.url(), zero)
	if err := nats.Repartition(ctx, pub.Conn(), with(zero, 4)); err != nil {
		t.Fatal(err)
	}
	if err := publish(with(zero, 4)); err != nil {
		t.Errorf("publisher with 4 partitions after Repartition: %v", err)
	}
	if err := publish(zero); !errors.Is(err, nats.ErrPartitions) {
		t.Errorf("unpartitioned publisher after Repartition: %v, want ErrPartitions", err)
	}
}

// TestRepartitionRefusesUndrained: Repartition refuses while a consumer of
// the stream has messages waiting.
func TestRepartitionRefusesUndrained(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	pub := newPublisher(t, srv.url(), n.stream)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(pub.Conn())
	if err != nil {
		t.Fatal(err)
	}
	cfg := nats.SubscriberConfig{Stream: n.stream, Consumer: "stock"}
	if _, err := js.CreateOrUpdateConsumer(ctx, n.stream.Name, cfg.ConsumerConfig()); err != nil {
		t.Fatal(err)
	}
	brokertest.Publish(t, pub, brokertest.NewMessage(t, "test.order.placed.v1", "1", 1))
	s := n.stream
	s.Partitions = 2
	if err := nats.Repartition(ctx, pub.Conn(), s); err == nil {
		t.Fatal("Repartition with a message pending: no error")
	}
}

// TestPartitionedWire: a partitioned publisher sends each message to
// <prefix>-p.<FNV-1a 32 of its key mod P>.<event name>; the subscriber of
// each partition receives exactly its partition's messages, with its
// durable consumer <consumer>-p<k> as their source; Redeliver to that
// source reaches that subscriber again, as PublishToConsumer to the
// consumer's name does for each message's partition; Inspect reports each
// partition's durable consumer.
func TestPartitionedWire(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	n.stream.Partitions = 3
	pub := newPublisher(t, srv.url(), n.stream)

	var mu sync.Mutex
	type got struct {
		partition int
		source    string
	}
	received := map[string][]got{}
	for k := range 3 {
		subscribe(t, srv.url(), n.stream, "stock", func(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
			mu.Lock()
			defer mu.Unlock()
			disps := make([]broker.Disposition, len(ds))
			for i, d := range ds {
				received[d.Message.EventID.String()] = append(received[d.Message.EventID.String()], got{k, d.Source})
				disps[i].Action = broker.Ack
			}
			return disps, make([]error, len(ds))
		}, func(c *nats.SubscriberConfig) { c.Partition = k })
	}
	var msgs []idem.Message
	for i := range 30 {
		msgs = append(msgs, brokertest.NewMessage(t, "test.order.placed.v1", string(rune('a'+i%26))+"x", i))
	}
	brokertest.Publish(t, pub, msgs...)
	count := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(received[id])
	}
	testsvc.WaitFor(t, 10*time.Second, "every message received", func() bool {
		for _, m := range msgs {
			if count(m.EventID.String()) == 0 {
				return false
			}
		}
		return true
	})

	js, err := jetstream.New(pub.Conn())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, n.stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs[:5] {
		h := fnv.New32a()
		_, _ = h.Write(m.Key)
		k := int(h.Sum32() % 3)
		if got := n.stream.Partition(m.Key); got != k {
			t.Errorf("Partition(%s) = %d, want %d", m.Key, got, k)
		}
		subject, err := n.stream.PartitionSubject(k, m.EventName)
		if err != nil {
			t.Fatal(err)
		}
		if want := n.stream.SubjectPrefix + "-p." + string(rune('0'+k)) + "." + m.EventName; subject != want || pub.Destination(m) != want {
			t.Errorf("subject %s, destination %s, want %s", subject, pub.Destination(m), want)
		}
		raw, err := stream.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			t.Fatalf("last message on %s: %v", subject, err)
		}
		if raw.Header.Get(nats.HeaderKey) == "" {
			t.Errorf("message on %s without key header", subject)
		}
	}
	mu.Lock()
	for _, m := range msgs {
		k := n.stream.Partition(m.Key)
		want := "stock-p" + string(rune('0'+k))
		if g := received[m.EventID.String()]; len(g) != 1 || g[0].partition != k || g[0].source != want {
			t.Errorf("message of key %s (partition %d) received %v, want once by partition %d from %s", m.Key, k, g, k, want)
		}
	}
	mu.Unlock()

	// Redeliver to the source: the same partition's subscriber again.
	m := msgs[0]
	k := n.stream.Partition(m.Key)
	if err := pub.Redeliver(ctx, "stock-p"+string(rune('0'+k)), []idem.Message{m}); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 10*time.Second, "the redelivered message received", func() bool { return count(m.EventID.String()) == 2 })
	mu.Lock()
	if g := received[m.EventID.String()]; g[1].partition != k {
		t.Errorf("redelivered message received by partition %d, want %d", g[1].partition, k)
	}
	mu.Unlock()

	// PublishToConsumer by the consumer's name: each message to the
	// partition of its key, as published.
	sent := msgs[1:7]
	if err := pub.PublishToConsumer(ctx, "stock", sent); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 10*time.Second, "the messages published to stock received", func() bool {
		for _, m := range sent {
			if count(m.EventID.String()) < 2 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	for _, m := range sent {
		if g := received[m.EventID.String()]; len(g) != 2 || g[1].partition != n.stream.Partition(m.Key) {
			t.Errorf("message of key %s published to stock: received %v, want a second time by partition %d", m.Key, g, n.stream.Partition(m.Key))
		}
	}
	mu.Unlock()

	stats, err := pub.Inspect(ctx, []string{"stock", "other"})
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 3 {
		t.Fatalf("Inspect: %+v, want the 3 partition durable consumers of stock", stats)
	}
	for i, s := range stats {
		if want := n.stream.Name + "/stock-p" + string(rune('0'+i)); s.Consumer != "stock" || s.Queue != want {
			t.Errorf("Inspect[%d] = %+v, want consumer stock, queue %s", i, s, want)
		}
	}
}

// TestSubscriberPartitionValidation: Partition must be within the stream's
// partitions, and 0 on an unpartitioned stream.
func TestSubscriberPartitionValidation(t *testing.T) {
	t.Parallel()
	deliver := func(context.Context, []broker.Delivery) ([]broker.Disposition, []error) { return nil, nil }
	for _, c := range []struct{ partitions, partition int }{{0, 1}, {4, 4}, {4, -1}} {
		_, err := nats.NewSubscriber(nats.SubscriberConfig{ConnConfig: nats.ConnConfig{URL: "nats://x"},
			Stream: nats.StreamConfig{Partitions: c.partitions}, Consumer: "stock", Partition: c.partition}, deliver)
		if err == nil {
			t.Errorf("Partitions %d, Partition %d: no error", c.partitions, c.partition)
		}
	}
	cfg := nats.SubscriberConfig{Stream: nats.StreamConfig{Partitions: 4}, Consumer: "stock", Partition: 2, Bindings: []string{"order.>"}}
	if d := cfg.Durable(); d != "stock-p2" {
		t.Errorf("Durable() = %s, want stock-p2", d)
	}
	want := []string{"events-p.2.order.>", "events-retry.stock-p2.>"}
	if got := cfg.FilterSubjects(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("FilterSubjects() = %v, want %v", got, want)
	}
}
